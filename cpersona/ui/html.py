"""HTML built from templates whose every value is escaped unless it is already :class:`Safe`.

Stored text (memory contents, agent names, entity names, hints) reaches the
page only through :func:`html`, so a memory holding ``<script>`` is shown as
text. Markup is made in one place: a value becomes :class:`Safe` only by
coming out of :func:`html`, :func:`join` or the SVG builders below, which
escape what they are given in turn.
"""

from __future__ import annotations

import html as _html
import math
import string
from collections.abc import Iterable, Sequence
from typing import Any


GLOBAL = "(global)"  # how a filter names the empty project or channel ('' is "no filter")


def axis_value(text: str | None) -> str | None:
    """A filter's query value as the column's: blank is no filter, GLOBAL the empty bucket."""
    if not text:
        return None
    return "" if text == GLOBAL else text


class Safe(str):
    """Markup already escaped; inserted as it is."""


def escape(value: Any) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(_html.escape("" if value is None else str(value), quote=True))


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return escape(value if isinstance(value, Safe) else format(value, format_spec))


_FORMATTER = _Escaping()


def html(template: str, *args: Any, **values: Any) -> Safe:
    """``template`` (a ``str.format`` string written here, never stored text) with every field escaped."""
    return Safe(_FORMATTER.format(template, *args, **values))


def join(parts: Iterable[Any], sep: str = "") -> Safe:
    return Safe(sep.join(escape(p) for p in parts))


def options(values: Iterable[str], chosen: str | None, *, blank: str | None = "any") -> Safe:
    """``<option>`` elements; ``blank`` labels the leading "no filter" choice (None: no such choice)."""
    items = (
        [html('<option value=""{sel}>{label}</option>', sel=Safe(" selected" if not chosen else ""), label=blank)]
        if blank is not None
        else []
    )
    for value in values:
        shown = value if value != "" else GLOBAL
        items.append(
            html('<option value="{v}"{sel}>{v}</option>', v=shown, sel=Safe(" selected" if shown == chosen else ""))
        )
    return join(items)


def layout(title: str, body: Safe, *, active: str, write: bool) -> Safe:
    pages = (
        ("search", "/", "Search"),
        ("timeline", "/timeline", "Timeline"),
        ("profile", "/profile", "Profile"),
        ("graph", "/graph", "Graph"),
        ("health", "/health", "Health"),
        ("stats", "/stats", "Charts"),
    )
    nav = join(
        html(
            '<a href="{href}"{cur}>{label}</a>',
            href=href,
            label=label,
            cur=Safe(' class="current" aria-current="page"' if key == active else ""),
        )
        for key, href, label in pages
    )
    mode = (
        html('<span class="mode write" title="started with --write">write enabled</span>')
        if write
        else html('<span class="mode" title="start with --write to edit">read-only</span>')
    )
    return html(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<title>{title} · cpersona</title><link rel="stylesheet" href="/static/ui.css">'
        '<script src="/static/ui.js" defer></script></head>'
        '<body data-page="{active}"><header><span class="brand">cpersona</span><nav>{nav}</nav>{mode}</header>'
        "<main><h1>{title}</h1>{body}</main></body></html>",
        title=title,
        active=active,
        nav=nav,
        mode=mode,
        body=body,
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, cls: str = "") -> Safe:
    head = join(html("<th>{h}</th>", h=h) for h in headers)
    body = join(html("<tr>{cells}</tr>", cells=join(html("<td>{c}</td>", c=c) for c in row)) for row in rows)
    return html(
        '<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
        cls=cls,
        head=head,
        body=body,
    )


def hidden_csrf(csrf: str) -> Safe:
    return html('<input type="hidden" name="csrf" value="{csrf}">', csrf=csrf)


# -- charts and the graph: inline SVG, drawn here so no script is needed to see them


def bar_chart(pairs: Sequence[tuple[Any, int | float]], *, title: str, unit: str = "") -> Safe:
    """A horizontal bar per (label, value); an empty series says so instead of drawing nothing."""
    if not pairs:
        return html(
            '<figure class="chart"><figcaption>{t}</figcaption><p class="empty">no rows yet</p></figure>', t=title
        )
    bar_h, gap, label_w, width = 18, 6, 150, 560
    peak = max(float(v) for _, v in pairs) or 1.0
    height = len(pairs) * (bar_h + gap) + gap
    bars = []
    for i, (label, value) in enumerate(pairs):
        y = gap + i * (bar_h + gap)
        w = max(1.0, (width - label_w - 70) * float(value) / peak)
        text = str(label) if label != "" else GLOBAL
        bars.append(
            html(
                '<g><title>{full}: {v}{u}</title><text x="{lx}" y="{ty}" class="label">{short}</text>'
                '<rect x="{bx}" y="{y}" width="{w:.1f}" height="{h}" rx="3"></rect>'
                '<text x="{vx:.1f}" y="{ty}" class="value">{v}{u}</text></g>',
                full=text,
                short=text if len(text) <= 22 else text[:21] + "…",
                v=value,
                u=unit,
                lx=label_w - 8,
                ty=y + bar_h - 4,
                bx=label_w,
                y=y,
                w=w,
                h=bar_h,
                vx=label_w + w + 6,
            )
        )
    return html(
        '<figure class="chart"><figcaption>{t}</figcaption>'
        '<svg viewBox="0 0 {W} {H}" role="img" aria-label="{t}">{bars}</svg>'
        "</figure>",
        t=title,
        W=width,
        H=height,
        bars=join(bars),
    )


def column_chart(pairs: Sequence[tuple[Any, int | float]], *, title: str) -> Safe:
    """A vertical bar per (day, value), oldest left; every few days labelled so the labels never overlap."""
    if not pairs:
        return html(
            '<figure class="chart"><figcaption>{t}</figcaption><p class="empty">no rows yet</p></figure>', t=title
        )
    width, height, left, bottom, top = 560, 200, 36, 34, 14
    peak = max(float(v) for _, v in pairs) or 1.0
    step = (width - left - 8) / len(pairs)
    every = max(1, math.ceil(len(pairs) / 6))
    bars = [
        html(
            '<text x="{x}" y="{y}" class="value">{p:g}</text>'
            '<line x1="{left}" y1="{base}" x2="{w}" y2="{base}" class="axis"></line>',
            x=4,
            y=top + 4,
            p=peak,
            left=left,
            base=height - bottom,
            w=width - 8,
        )
    ]
    for i, (day, value) in enumerate(pairs):
        h = max(1.0, (height - bottom - top) * float(value) / peak)
        x = left + i * step
        label = (
            html(
                '<text x="{cx:.1f}" y="{ly}" class="tick">{d}</text>',
                cx=x + step / 2,
                ly=height - bottom + 16,
                d=str(day)[5:] if len(str(day)) == 10 else day,
            )
            if i % every == 0 or i == len(pairs) - 1
            else ""
        )
        bars.append(
            html(
                '<g><title>{d}: {v}</title><rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                'rx="2"></rect>{label}</g>',
                d=day,
                v=value,
                x=x + step * 0.12,
                y=height - bottom - h,
                bw=max(1.0, step * 0.76),
                h=h,
                label=label,
            )
        )
    return html(
        '<figure class="chart"><figcaption>{t}</figcaption>'
        '<svg viewBox="0 0 {W} {H}" role="img" aria-label="{t}">{bars}</svg></figure>',
        t=title,
        W=width,
        H=height,
        bars=join(bars),
    )


def graph_svg(entities: Sequence[dict[str, Any]], relations: Sequence[dict[str, Any]]) -> Safe:
    """The traverse answer drawn: the named entity in the middle, each hop on a ring further out."""
    size = 640
    centre = size / 2
    by_hops: dict[int, list[dict[str, Any]]] = {}
    for entity in entities:
        by_hops.setdefault(int(entity.get("hops", 0)), []).append(entity)
    ring = (centre - 70) / max(1, max(by_hops, default=1))  # the outermost ring keeps its labels inside
    start: dict[int, tuple[float, float]] = {}
    for hops, group in sorted(by_hops.items()):
        radius = ring * hops if hops else (0 if len(group) == 1 else min(60.0, ring / 2))
        for i, entity in enumerate(group):
            angle = 2 * math.pi * i / len(group) - math.pi / 2 + hops * 0.4
            start[entity["id"]] = (centre + radius * math.cos(angle), centre + radius * math.sin(angle))
    links = [
        (r.get("subject"), r.get("object")) for r in relations if r.get("subject") in start and r.get("object") in start
    ]
    place = _spread(start, links, size)
    edges, nodes = [], []
    for rel in relations:
        a, b = place.get(rel.get("subject")), place.get(rel.get("object"))
        if a is None or b is None:
            continue
        edges.append(
            html(
                '<g class="edge" data-from="{s}" data-to="{o}"><title>{sn} {p} {on}</title>'
                '<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" marker-end="url(#arrow)"></line>'
                '<text x="{mx:.1f}" y="{my:.1f}">{p}</text></g>',
                s=rel["subject"],
                o=rel["object"],
                p=rel.get("predicate", ""),
                x1=a[0],
                y1=a[1],
                x2=b[0],
                y2=b[1],
                mx=(a[0] + b[0]) / 2,
                my=(a[1] + b[1]) / 2 - 4,
                sn=_name(entities, rel["subject"]),
                on=_name(entities, rel["object"]),
            )
        )
    for entity in entities:
        x, y = place[entity["id"]]
        mentions = entity.get("mentions") or []
        nodes.append(
            html(
                '<g class="node hops{hops}" data-id="{id}"><title>{name} · {hops} hop(s) · {m} mention(s)</title>'
                '<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}"></circle>'
                '<text x="{x:.1f}" y="{ty:.1f}">{name}</text></g>',
                hops=min(int(entity.get("hops", 0)), 3),
                id=entity["id"],
                name=entity.get("name", ""),
                m=len(mentions),
                x=x,
                y=y,
                r=14 if entity.get("hops", 0) == 0 else 10,
                ty=y + 28,
            )
        )
    return html(
        '<svg id="graph" viewBox="0 0 {S} {S}" width="{S}" height="{S}" role="img" aria-label="association graph">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="22" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"></path></marker></defs>{edges}{nodes}</svg>',
        S=size,
        edges=join(edges),
        nodes=join(nodes),
    )


def _spread(
    start: dict[int, tuple[float, float]], links: Sequence[tuple[Any, Any]], size: int, rounds: int = 150
) -> dict[int, tuple[float, float]]:
    """Fruchterman-Reingold from the ring layout: linked nodes pull together, all push apart.

    Deterministic (the same answer draws the same picture) and bounded: a
    traverse answer holds at most a few dozen entities, so rounds × n² stays small.
    """
    ids = list(start)
    if len(ids) < 2:
        return {i: (size / 2, size / 2) for i in ids}
    pos = {i: list(start[i]) for i in ids}
    k = 0.9 * math.sqrt(size * size / len(ids))
    heat = size / 8
    for _ in range(rounds):
        move = {i: [0.0, 0.0] for i in ids}
        for n, a in enumerate(ids):
            for b in ids[n + 1 :]:
                dx, dy = pos[a][0] - pos[b][0], pos[a][1] - pos[b][1]
                d = max(1.0, math.hypot(dx, dy))
                push = k * k / d
                move[a][0] += dx / d * push
                move[a][1] += dy / d * push
                move[b][0] -= dx / d * push
                move[b][1] -= dy / d * push
        for a, b in links:
            dx, dy = pos[a][0] - pos[b][0], pos[a][1] - pos[b][1]
            d = max(1.0, math.hypot(dx, dy))
            pull = d * d / k
            move[a][0] -= dx / d * pull
            move[a][1] -= dy / d * pull
            move[b][0] += dx / d * pull
            move[b][1] += dy / d * pull
        for i in ids:
            # Gravity keeps separate components in one picture instead of drifting apart.
            move[i][0] -= (pos[i][0] - size / 2) * 0.1 * k / size * 10
            move[i][1] -= (pos[i][1] - size / 2) * 0.1 * k / size * 10
            length = max(1e-9, math.hypot(*move[i]))
            step = min(length, heat)
            pos[i][0] = min(size, max(0.0, pos[i][0] + move[i][0] / length * step))
            pos[i][1] = min(size, max(0.0, pos[i][1] + move[i][1] / length * step))
        heat *= 0.97
    # Fit the drawing into the frame, leaving room for the labels.
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    margin = 70
    span = max(max(xs) - min(xs), max(ys) - min(ys), 1.0)
    scale = (size - 2 * margin) / span
    ox = (size - (max(xs) - min(xs)) * scale) / 2
    oy = (size - (max(ys) - min(ys)) * scale) / 2
    return {i: (ox + (p[0] - min(xs)) * scale, oy + (p[1] - min(ys)) * scale) for i, p in pos.items()}


def _name(entities: Sequence[dict[str, Any]], entity_id: Any) -> str:
    return next((e.get("name", "") for e in entities if e["id"] == entity_id), f"#{entity_id}")
