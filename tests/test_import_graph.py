"""The import graph of the cpersona package: no cycles between packages, layers point down only.

Layers, top to bottom (a module may import its own layer's packages and any
layer below, never one above):

    entry      cli.py, admin_cli.py, checkup.py, model_cli.py, proxy_stdio.py,
               proxy_spawn.py, background.py (what a serve starts after its
               first answer), people_cli.py, tool_cli.py, hooks.py, the ui
               package (the web page), __main__.py: the command line
    mcp        cpersona/mcp (the MCP facade, its tools and transports)
    services   cpersona/services and each of its sub-packages
    storage    cpersona/storage, cpersona/embedding
    base       cpersona/__init__.py (the version), config.py, config_env.py, config_docs.py

Which imports count: every ``import`` statement in a module, at module level
and inside functions alike, because a deferred import is still a dependency
(the function cannot run without the package it imports). Two kinds do not:

- imports under ``if TYPE_CHECKING:``: they never run; they only name types
  for annotations;
- the imports inside the service builders of ``services/app.py``. That module
  is the services layer's composition root: ``App`` declares every
  per-process service as a typed attribute and builds it on first use, so it
  must reach the class of each service, while every service package imports
  ``App``. Counting those builder imports would make every service package
  "depend" on every other through ``App``; the dependency that matters, which
  package's code calls which, is what the other imports show.

Within the entry and base layers the modules are one node each (the command
line is one program split across files; ``config_docs`` writes the
documentation of ``config``), and ``cpersona/mcp`` with its ``tools``
sub-package is one node. Cycles inside one node are not this test's business.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cpersona"
COMPOSITION_ROOT = "cpersona.services.app"

ENTRY = {
    "cpersona.cli",
    "cpersona.admin_cli",
    "cpersona.checkup",
    "cpersona.__main__",
    "cpersona.model_cli",
    "cpersona.proxy_stdio",
    "cpersona.proxy_spawn",
    "cpersona.background",
    "cpersona.people_cli",
    "cpersona.tool_cli",
    "cpersona.hooks",
}
BASE = {"cpersona", "cpersona.config", "cpersona.config_env", "cpersona.config_docs"}
RANK = {"entry": 4, "mcp": 3, "services": 2, "storage": 1, "base": 0}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def node_of(module: str) -> str:
    if module in ENTRY or module.split(".")[:2] == ["cpersona", "ui"]:
        return "entry"
    if module in BASE:
        return "base"
    parts = module.split(".")
    if parts[1] == "services" and len(parts) > 2 and (PACKAGE / "services" / parts[2]).is_dir():
        return f"services.{parts[2]}"  # a sub-package of services, its __init__ included
    return {"mcp": "mcp", "services": "services", "storage": "storage", "embedding": "embedding"}[parts[1]]


def layer_of(node: str) -> str:
    if node.startswith("services"):
        return "services"
    return "storage" if node == "embedding" else node


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _builders(module: str, tree: ast.Module) -> set[int]:
    if module != COMPOSITION_ROOT:
        return set()
    return {id(inner) for fn in tree.body if isinstance(fn, ast.FunctionDef) for inner in ast.walk(fn)}


def _targets(module: str, stmt: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    if isinstance(stmt, ast.Import):
        names = [alias.name for alias in stmt.names]
    else:
        base = stmt.module or ""
        if stmt.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - (stmt.level - 1)]
            base = ".".join([*here, base] if base else here)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in stmt.names]
    found = []
    for name in names:
        if name.split(".")[0] != "cpersona":
            continue
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        found.append(name)
    return found


def imports() -> dict[str, set[str]]:
    """Module → the cpersona modules it imports (the counted ones, see the module docstring)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skipped = _type_checking_only(tree) | _builders(module, tree)
        for stmt in ast.walk(tree):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)) and id(stmt) not in skipped:
                edges[module].update(_targets(module, stmt, path.name == "__init__.py"))
    return edges


def package_graph() -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Node → node it imports → the (importer, imported) module pairs behind that edge."""
    graph: dict[str, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for importer, targets in imports().items():
        for target in targets:
            a, b = node_of(importer), node_of(target)
            if a != b:
                graph[a][b].append((importer, target))
    return graph


def find_cycle(graph: dict[str, dict[str, list[tuple[str, str]]]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def describe(graph, cycle: list[str]) -> str:
    return "\n".join(f"{a} -> {b}: {sorted(set(graph[a][b]))[:3]}" for a, b in zip(cycle, cycle[1:]))


def test_the_graph_is_read():
    """Guards the test itself: the resolver sees the imports every layer is known to make."""
    graph = package_graph()
    assert ("cpersona.mcp.dispatch", "cpersona.services.app") in graph["mcp"]["services"]
    assert graph["services.recall"]["storage"] and graph["entry"]["mcp"]
    assert set(RANK) | {"embedding"} >= {layer_of(n) for n in graph} | {"embedding"}


def test_no_cycles_between_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages:\n" + describe(graph, cycle)


def test_layers_point_down_only():
    graph = package_graph()
    upward = [
        f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)}): {sorted(set(why))[:3]}"
        for a, targets in graph.items()
        for b, why in targets.items()
        if RANK[layer_of(a)] < RANK[layer_of(b)]
    ]
    assert upward == [], "imports that point up a layer:\n" + "\n".join(upward)


def test_only_the_mcp_layer_speaks_the_mcp_sdk():
    """services never import the MCP SDK (tests call them directly); storage and embedding neither."""
    offenders = []
    for module, path in MODULES.items():
        if layer_of(node_of(module)) not in ("services", "storage", "base"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for stmt in ast.walk(tree):
            names = (
                [a.name for a in stmt.names]
                if isinstance(stmt, ast.Import)
                else [stmt.module or ""]
                if isinstance(stmt, ast.ImportFrom) and not stmt.level
                else []
            )
            offenders += [f"{module}: {n}" for n in names if n == "mcp" or n.startswith("mcp.")]
    assert offenders == []


def test_the_cycle_finder_finds_a_cycle():
    toy = {"a": {"b": [("a.x", "b.y")]}, "b": {"c": [("b.y", "c.z")]}, "c": {"a": [("c.z", "a.x")]}}
    assert find_cycle(toy) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {}}) is None
