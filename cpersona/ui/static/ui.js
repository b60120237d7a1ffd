// cpersona ui: the little the pages do in the browser. Everything is readable without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // Timeline: a changed filter applies at once.
  const filters = document.getElementById("timeline-filters");
  if (filters) {
    filters.querySelectorAll("select").forEach((el) => el.addEventListener("change", () => filters.submit()));
  }
  // Graph: hovering a node lights it, its relations and its neighbours.
  const graph = document.getElementById("graph");
  if (graph) {
    const nodes = graph.querySelectorAll(".node");
    const edges = graph.querySelectorAll(".edge");
    nodes.forEach((node) => {
      node.addEventListener("mouseenter", () => {
        const id = node.dataset.id;
        graph.classList.add("focus");
        node.classList.add("lit");
        edges.forEach((edge) => {
          if (edge.dataset.from === id || edge.dataset.to === id) {
            edge.classList.add("lit");
            const other = edge.dataset.from === id ? edge.dataset.to : edge.dataset.from;
            graph.querySelectorAll(`.node[data-id="${CSS.escape(other)}"]`).forEach((n) => n.classList.add("lit"));
          }
        });
      });
      node.addEventListener("mouseleave", () => {
        graph.classList.remove("focus");
        graph.querySelectorAll(".lit").forEach((el) => el.classList.remove("lit"));
      });
    });
  }
});
