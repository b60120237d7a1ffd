"""The pages of ``cpersona ui``: each reads its query, asks a tool or a browse service, renders HTML.

Search, profile, graph and health are tool answers (recall, get_profile,
traverse, check_health with fix=false); timeline, record and charts read
through :mod:`cpersona.services.records.browse`. Changes are tool calls too
(:meth:`UiState.tool` refuses them without ``--write``); delete asks first.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from cpersona.services.records import browse
from cpersona.storage.repositories.browse import KINDS, TimelineFilter
from cpersona.ui.html import (
    GLOBAL,
    Safe,
    axis_value,
    bar_chart,
    column_chart,
    escape,
    graph_svg,
    hidden_csrf,
    html,
    join,
    layout,
    options,
    table,
)
from cpersona.ui.server import UiState, WriteRefused

MAX_FORM_BYTES = 4 << 20  # an edited memory plus the form's few fields
TEXT_PREVIEW = 300


def _page(state: UiState, title: str, body: Safe, active: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(layout(title, body, active=active, write=state.write), status_code=status)


def _arg(request: Request, name: str, default: str = "") -> str:
    return request.query_params.get(name, default).strip()


def _int(text: str, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(text)))
    except ValueError:
        return default


def _ref_link(kind: str, record_id: Any) -> Safe:
    return html('<a href="/record/{k}/{i}">{k}:{i}</a>', k=kind, i=record_id)


def _preview(text: str, limit: int = TEXT_PREVIEW) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _value(value: Any) -> Safe:
    """A JSON value as nested lists: strings keep their line breaks, every leaf escaped."""
    if isinstance(value, dict):
        return html(
            '<dl class="kv">{items}</dl>',
            items=join(html("<dt>{k}</dt><dd>{v}</dd>", k=k, v=_value(v)) for k, v in value.items()),
        )
    if isinstance(value, list):
        return html("<ol>{items}</ol>", items=join(html("<li>{v}</li>", v=_value(v)) for v in value))
    if isinstance(value, str):
        return html('<span class="text">{v}</span>', v=value)
    return html("<code>{v}</code>", v=json.dumps(value, default=str))


def _answer_box(answer: dict[str, Any], *, skip: tuple[str, ...] = ()) -> Safe:
    """A tool answer's keys (its notices and verdicts), every value escaped."""
    shown = {k: v for k, v in answer.items() if k not in skip}
    if not shown:
        return Safe("")
    return html('<div class="notices">{v}</div>', v=_value(shown))


def _reason(reason: dict[str, Any]) -> Safe:
    return join(
        html('<span class="chip">{k} {v}</span>', k=k, v=f"{v:.4g}" if isinstance(v, float) else v)
        for k, v in reason.items()
    )


def _refusal(answer: dict[str, Any]) -> Safe:
    if answer.get("ok") is False or "error" in answer:
        return html('<p class="refused" role="alert">Refused: {e}</p>', e=answer.get("error", "unknown error"))
    return Safe("")


def _chosen_agent(request: Request, facets: dict[str, list[str]]) -> str:
    """The agent a tool page acts for: the one asked for, else the first stored (GLOBAL is the empty id)."""
    asked = axis_value(_arg(request, "agent"))
    if asked is not None:
        return asked
    return facets["agent_id"][0] if facets["agent_id"] else ""


def _agent_picker(facets: dict[str, list[str]], chosen: str) -> Safe:
    return html(
        '<label>agent <select name="agent" required>{o}</select></label>',
        o=options(facets["agent_id"], chosen or GLOBAL, blank=None if facets["agent_id"] else "(none stored)"),
    )


# -- search ------------------------------------------------------------------------------------


async def search(request: Request, state: UiState) -> Response:
    query = _arg(request, "q")
    limit = _int(_arg(request, "limit", "10"), 10, 1, 100)
    channel, project = _arg(request, "channel"), _arg(request, "project")
    facets = await state.read(browse.facets)
    agent = _chosen_agent(request, facets)
    form = html(
        '<form class="filters" method="get" action="/">'
        '<label class="grow">query <input type="search" name="q" value="{q}" autofocus></label>{agent}'
        '<label>channel <input name="channel" value="{c}" size="10"></label>'
        '<label>project <input name="project" value="{p}" size="10"></label>'
        '<label>limit <input type="number" name="limit" min="1" max="100" value="{n}"></label>'
        '<button type="submit">Recall</button></form>',
        q=query,
        agent=_agent_picker(facets, agent),
        c=channel,
        p=project,
        n=limit,
    )
    if not query:
        return _page(
            state,
            "Search",
            html(
                '{f}<p class="hint">Search runs the recall tool itself: the ranking, '
                "the gate and the notices an agent would get.</p>",
                f=form,
            ),
            "search",
        )
    arguments: dict[str, Any] = {"agent_id": agent, "query": query, "limit": limit}
    if channel:
        arguments["channel"] = channel
    if project:
        arguments["project_id"] = project
    answer = await state.tool("recall", **arguments)
    messages = list(reversed(answer.get("messages") or []))  # recall answers worst first; a reader wants best
    items = []
    for rank, message in enumerate(messages, 1):
        ref = str(message.get("ref", ""))
        kind, _, number = ref.partition(":")
        link = _ref_link(kind, number) if kind in KINDS and number.isdigit() else escape(ref)
        reason = message.get("match_reason") or {}
        items.append(
            html(
                '<li class="hit"><div class="meta"><span class="rank">#{rank}</span> {link} · {ts}</div>'
                '<div class="content">{content}</div><div class="reason">match_reason {reason}</div></li>',
                rank=rank,
                link=link,
                ts=message.get("timestamp", ""),
                content=message.get("content", ""),
                reason=_reason(reason),
            )
        )
    results = (
        html('<ol class="hits">{i}</ol>', i=join(items))
        if items
        else html('<p class="empty">recall returned no rows</p>')
    )
    notices = _answer_box(answer, skip=("messages",))
    body = html(
        '{f}{refused}<p class="count">{n} row(s), best first</p>{r}<h2>Notices and verdicts</h2>{notices}',
        f=form,
        refused=_refusal(answer),
        n=len(items),
        r=results,
        notices=notices or html('<p class="empty">none</p>'),
    )
    return _page(state, "Search", body, "search")


# -- timeline ----------------------------------------------------------------------------------


def _day_or_blank(text: str) -> str:
    try:
        return datetime.strptime(text, "%Y-%m-%d").strftime("%Y-%m-%d")
    except ValueError:
        return ""


async def timeline(request: Request, state: UiState) -> Response:
    values = {key: request.query_params.get(key) for key in ("agent", "project", "channel")}
    kind = _arg(request, "kind")
    wanted = TimelineFilter(
        agent_id=axis_value(values["agent"]),
        project_id=axis_value(values["project"]),
        channel=axis_value(values["channel"]),
        since=_day_or_blank(_arg(request, "since")),
        until=_day_or_blank(_arg(request, "until")),
        kinds=(kind,) if kind in KINDS else KINDS,
    )
    limit = _int(_arg(request, "limit", "100"), 100, 1, browse.TIMELINE_MAX_ROWS)
    found = await state.read(browse.timeline, wanted, limit)
    facets = found["facets"]
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    form = html(
        '<form class="filters" id="timeline-filters" method="get" action="/timeline">'
        '<label>agent <select name="agent">{a}</select></label>'
        '<label>project <select name="project">{p}</select></label>'
        '<label>channel <select name="channel">{c}</select></label>'
        '<label>kind <select name="kind">{k}</select></label>'
        '<label>since <input type="date" name="since" value="{since}"></label>'
        '<label>until <input type="date" name="until" value="{until}"></label>'
        '<button type="submit">Filter</button> <a class="button" href="/timeline?{today_q}">stored today</a>'
        ' <a href="/timeline">clear</a></form>',
        a=options(facets["agent_id"], values["agent"]),
        p=options(facets["project_id"], values["project"]),
        c=options(facets["channel"], values["channel"]),
        k=join(
            [
                html('<option value=""{s}>memories and episodes</option>', s=Safe(" selected" if not kind else "")),
                html('<option value="mem"{s}>memories</option>', s=Safe(" selected" if kind == "mem" else "")),
                html('<option value="ep"{s}>episodes</option>', s=Safe(" selected" if kind == "ep" else "")),
            ]
        ),
        since=wanted.since,
        until=wanted.until,
        today_q=urlencode({"since": today, "until": today}),
    )
    rows = [
        (
            row["created_at"],
            _ref_link(row["kind"], row["id"]),
            row["agent_id"],
            row["project_id"] or GLOBAL,
            row["channel"] or GLOBAL,
            html('<span class="text">{t}</span>', t=_preview(row["text"])),
            "locked" if row["locked"] else "",
        )
        for row in found["rows"]
    ]
    listing = (
        table(("stored", "ref", "agent", "project", "channel", "text", ""), rows, cls="timeline")
        if rows
        else html('<p class="empty">no rows match these filters</p>')
    )
    more = (
        html('<p class="hint">showing the newest {n}; narrow the filters to see older rows</p>', n=found["limit"])
        if found["truncated"]
        else Safe("")
    )
    body = html('{f}<p class="count">{n} row(s)</p>{more}{t}', f=form, n=len(rows), more=more, t=listing)
    return _page(state, "Timeline", body, "timeline")


# -- one record --------------------------------------------------------------------------------


def _record_key(request: Request) -> tuple[str, int] | None:
    kind, number = request.path_params["kind"], request.path_params["record_id"]
    if kind not in KINDS or not number.isdigit() or len(number) > 18:
        return None
    return kind, int(number)


def _not_found(state: UiState, what: str) -> HTMLResponse:
    return _page(state, "Not found", html('<p class="refused">{w}</p>', w=what), "timeline", status=404)


def _end(end: dict[str, Any], agent: str) -> Safe:
    if end["kind"] == "entity":
        return html('<a href="/graph?{q}">{n}</a>', q=urlencode({"agent": agent, "entity": end["name"]}), n=end["name"])
    return _ref_link(end["kind"], end["id"])


def _write_controls(state: UiState, kind: str, record_id: int, fields: dict[str, Any]) -> Safe:
    if not state.write:
        return html(
            '<p class="hint">Read-only: start <code>cpersona ui --write</code> to edit, lock, unlock or delete.</p>'
        )
    base = f"/record/{kind}/{record_id}"
    parts = []
    if kind == "mem":
        parts.append(
            html(
                '<form method="post" action="{b}/edit" class="edit">{c}<label>content<textarea name="content" rows="6">'
                '{text}</textarea></label><button type="submit">Save edit</button></form>',
                b=base,
                c=hidden_csrf(state.csrf),
                text=fields["content"],
            )
        )
        action = "unlock" if fields["locked"] else "lock"
        parts.append(
            html(
                '<form method="post" action="{b}/{a}" class="inline">{c}<button type="submit">{label}</button></form>',
                b=base,
                a=action,
                c=hidden_csrf(state.csrf),
                label=action.capitalize(),
            )
        )
    parts.append(html('<a class="button danger" href="{b}/delete">Delete…</a>', b=base))
    return html('<section class="actions"><h2>Change</h2>{p}</section>', p=join(parts))


def _field(value: Any) -> Any:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value if isinstance(value, (str, int, float)) else json.dumps(value, ensure_ascii=False)


async def record(request: Request, state: UiState) -> Response:
    key = _record_key(request)
    found = await state.read(browse.record, *key) if key else None
    if found is None:
        return _not_found(state, "no such record")
    kind, record_id = key
    fields = found["fields"]
    text = fields["content"] if kind == "mem" else fields["summary"]
    shown = {k: v for k, v in fields.items() if k not in ("content", "summary")}
    details = table(("field", "value"), [(k, _field(v)) for k, v in shown.items()], cls="fields")
    ranges = (
        table(
            ("node", "chars", "tokens", "window", "vector", "text"),
            [
                (
                    r["index"],
                    f"{r['start']}–{r['end']}",
                    r["tokens"],
                    r["window"],
                    r["embedding_model"] or ("yes" if r["embedded"] else "no"),
                    r["text"],
                )
                for r in found["ranges"]
            ],
        )
        if found["ranges"]
        else html('<p class="empty">no nodes: the record is short enough to be one range</p>')
    )
    agent = fields["agent_id"]
    entities = join(
        html(
            '<li><a href="/graph?{q}">{n}</a>{al}</li>',
            q=urlencode({"agent": agent, "entity": e["name"]}),
            n=e["name"],
            al=html(" (aliases: {a})", a=", ".join(e["aliases"])) if e["aliases"] else "",
        )
        for e in found["entities"]
    )
    relations = join(
        html("<li>{s} <em>{p}</em> {o}</li>", s=_end(r["subject"], agent), p=r["predicate"], o=_end(r["object"], agent))
        for r in found["relations"]
    )
    recall = found["recall"]
    history = (
        html("<p>recalled {n} time(s); last {last}</p>", n=recall["count"], last=recall["last_recalled_at"] or "never")
        if recall
        else html('<p class="hint">episodes keep no recall counter</p>')
    )
    body = html(
        '<p class="meta">{ref} · agent {agent}</p><pre class="record-text">{text}</pre>{controls}'
        "<h2>Fields</h2>{details}<h2>Ranges (nodes)</h2>{ranges}<h2>Entities mentioned</h2>{entities}"
        "<h2>Associations</h2>{relations}<h2>Recall history</h2>{history}",
        ref=found["ref"],
        agent=agent,
        text=text,
        controls=_write_controls(state, kind, record_id, fields),
        details=details,
        ranges=ranges,
        entities=html("<ul>{e}</ul>", e=entities) if found["entities"] else html('<p class="empty">none</p>'),
        relations=html("<ul>{r}</ul>", r=relations) if found["relations"] else html('<p class="empty">none</p>'),
        history=history,
    )
    return _page(state, f"Record {found['ref']}", body, "timeline")


async def confirm_delete(request: Request, state: UiState) -> Response:
    if not state.write:
        raise WriteRefused("delete")
    key = _record_key(request)
    found = await state.read(browse.record, *key) if key else None
    if found is None:
        return _not_found(state, "no such record")
    fields = found["fields"]
    text = fields["content"] if key[0] == "mem" else fields["summary"]
    body = html(
        "<p>Delete <strong>{ref}</strong> of agent {agent}? This cannot be undone.</p>"
        '<pre class="record-text">{text}</pre>'
        '<form method="post" action="/record/{k}/{i}/delete">{c}<input type="hidden" name="confirm" value="yes">'
        '<button type="submit" class="danger">Yes, delete it</button> <a href="/record/{k}/{i}">No, keep it</a>'
        "</form>",
        ref=found["ref"],
        agent=fields["agent_id"],
        text=_preview(text, 2000),
        k=key[0],
        i=key[1],
        c=hidden_csrf(state.csrf),
    )
    return _page(state, "Confirm delete", body, "timeline")


async def _form(request: Request) -> dict[str, str] | None:
    """The url-encoded form, or None past MAX_FORM_BYTES (read no further than that)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return dict(parse_qsl(b"".join(chunks).decode("utf-8", "replace"), keep_blank_values=True))


ACTIONS = {
    ("mem", "edit"): "update_memory",
    ("mem", "lock"): "lock_memory",
    ("mem", "unlock"): "unlock_memory",
    ("mem", "delete"): "delete_memory",
    ("ep", "delete"): "delete_episode",
}


async def change(request: Request, state: UiState) -> Response:
    key = _record_key(request)
    tool = ACTIONS.get((key[0], request.path_params["action"])) if key else None
    if tool is None:
        return _not_found(state, "no such action")
    if not state.write:
        raise WriteRefused(tool)
    form = await _form(request)
    if form is None:
        return _page(
            state,
            "Too large",
            html('<p class="refused">the form is larger than this page accepts</p>'),
            "timeline",
            status=413,
        )
    if not hmac.compare_digest(form.get("csrf", "").encode(), state.csrf.encode()):
        return _page(
            state,
            "Refused",
            html('<p class="refused">the form did not come from this page</p>'),
            "timeline",
            status=403,
        )
    kind, record_id = key
    if tool.startswith("delete") and form.get("confirm") != "yes":
        return _page(
            state,
            "Refused",
            html('<p class="refused">a delete needs its confirmation step</p>'),
            "timeline",
            status=400,
        )
    found = await state.read(browse.record, kind, record_id)
    if found is None:
        return _not_found(state, "no such record")
    arguments: dict[str, Any] = {
        "agent_id": found["fields"]["agent_id"],
        ("memory_id" if kind == "mem" else "episode_id"): record_id,
    }
    if tool == "update_memory":
        arguments["content"] = form.get("content", "")
    answer = await state.tool(tool, change=True, **arguments)
    done = answer.get("ok") is True and answer.get("persisted") is not False
    back = (
        Safe("")
        if done and tool.startswith("delete")
        else html('<p><a href="/record/{k}/{i}">back to {k}:{i}</a></p>', k=kind, i=record_id)
    )
    body = html(
        '<p class="{cls}" role="status">{tool}: {verdict}</p>{box}{back}',
        cls="done" if done else "refused",
        tool=tool,
        verdict="done" if done else "not done",
        box=_answer_box(answer),
        back=back,
    )
    return _page(state, "Change", body, "timeline", status=200 if done else 409)


def refused_write(state: UiState, tool: str) -> HTMLResponse:
    body = html(
        '<p class="refused" role="alert">{tool} refused: this page was started read-only. Restart it '
        "with <code>cpersona ui --write</code> to change records.</p>",
        tool=tool,
    )
    return _page(state, "Read-only", body, "timeline", status=403)


# -- profile, graph, health ---------------------------------------------------------------------


async def profile(request: Request, state: UiState) -> Response:
    facets = await state.read(browse.facets)
    agent = _chosen_agent(request, facets)
    form = html(
        '<form class="filters" method="get" action="/profile">{a}<button type="submit">Show</button></form>',
        a=_agent_picker(facets, agent),
    )
    if not agent:
        return _page(
            state, "Profile", html('{f}<p class="empty">no agent has stored anything yet</p>', f=form), "profile"
        )
    answer = await state.tool("get_profile", agent_id=agent)
    text = answer.get("profile")
    shown = (
        html('<pre class="record-text">{t}</pre>', t=text)
        if text
        else html('<p class="empty">no profile for {a}</p>', a=agent)
    )
    return _page(state, "Profile", html("{f}{r}{s}", f=form, r=_refusal(answer), s=shown), "profile")


async def graph(request: Request, state: UiState) -> Response:
    facets = await state.read(browse.facets)
    agent = _chosen_agent(request, facets)
    entity = _arg(request, "entity")
    hops = _int(_arg(request, "hops", "2"), 2, 1, 3)
    names = await state.read(browse.entity_names, agent or None)
    suggestions = join(html('<option value="{n}"></option>', n=name) for name in names)
    form = html(
        '<form class="filters" method="get" action="/graph">{a}'
        '<label class="grow">entity <input name="entity" value="{e}" list="entity-names" required></label>'
        '<datalist id="entity-names">{s}</datalist>'
        '<label>hops <input type="number" name="hops" min="1" max="3" value="{h}"></label>'
        '<button type="submit">Draw</button></form>',
        a=_agent_picker(facets, agent),
        e=entity,
        s=suggestions,
        h=hops,
    )
    if not entity or not agent:
        known = join(
            html('<a class="chip" href="/graph?{q}">{n}</a>', q=urlencode({"agent": agent, "entity": n}), n=n)
            for n in names[:60]
        )
        return _page(
            state,
            "Association graph",
            html(
                '{f}<p class="hint">Entities of {a}:</p><p>{k}</p>',
                f=form,
                a=agent or "(none)",
                k=known or "none declared",
            ),
            "graph",
        )
    answer = await state.tool("traverse", agent_id=agent, entity=entity, max_hops=hops)
    entities = answer.get("entities") or []
    drawing = (
        graph_svg(entities, answer.get("relations") or [])
        if entities
        else html('<p class="empty">no entity named {e} is readable by {a}</p>', e=entity, a=agent)
    )
    legend = html(
        '<p class="hint">{n} entities, {r} relations; the entity named is red (one node per project and '
        "channel it is declared in), farther hops paler. Hover a node to follow its relations.</p>",
        n=len(entities),
        r=len(answer.get("relations") or []),
    )
    mentions = join(
        html(
            "<li>{n}: {refs}</li>",
            n=e.get("name", ""),
            refs=join(
                (
                    _ref_link(*m.split(":", 1)) if m.split(":", 1)[0] in KINDS else escape(m)
                    for m in e.get("mentions", [])
                ),
                ", ",
            ),
        )
        for e in entities
        if e.get("mentions")
    )
    body = html(
        '{f}{r}{legend}<div class="graph-wrap">{d}</div><h2>Mentioned in</h2><ul>{m}</ul>',
        f=form,
        r=_refusal(answer),
        legend=legend if entities else "",
        d=drawing,
        m=mentions,
    )
    return _page(state, "Association graph", body, "graph")


async def health(request: Request, state: UiState) -> Response:
    agent = _arg(request, "agent")
    facets = await state.read(browse.facets)
    form = html(
        '<form class="filters" method="get" action="/health"><label>agent <select name="agent">{o}</select>'
        '</label><button type="submit">Check</button></form>',
        o=options(facets["agent_id"], agent, blank="every agent"),
    )
    answer = await state.tool("check_health", agent_id=agent, fix=False)
    issues = answer.get("issues") or []
    rows = [
        (
            html('<span class="sev {s}">{s}</span>', s=i.get("severity", "")),
            i.get("check") or i.get("type", ""),
            i.get("count", ""),
            i.get("hint", ""),
        )
        for i in issues
    ]
    findings = (
        table(("severity", "check", "count", "fix hint"), rows, cls="findings")
        if rows
        else html('<p class="empty">no findings</p>')
    )
    summary = answer.get("severity_summary") or {}
    body = html(
        '{f}{r}<p class="status">status: <strong>{st}</strong> · critical {c} · warn {w} · info {i} · '
        '{n} memories</p><p class="hint">Read-only check (fix=false); <code>cpersona checkup</code> or the '
        "check_health tool with fix=true repairs what is repairable.</p>{t}",
        f=form,
        r=_refusal(answer),
        st=answer.get("status", "?"),
        c=summary.get("critical", 0),
        w=summary.get("warn", 0),
        i=summary.get("info", 0),
        n=answer.get("total_memories", "?"),
        t=findings,
    )
    return _page(state, "Health", body, "health")


async def stats(request: Request, state: UiState) -> Response:
    figures = await state.read(browse.activity)
    size = figures["db_size_bytes"]
    recalled = [
        (
            html('<a href="/record/mem/{i}">mem:{i}</a>', i=r["id"]),
            r["agent_id"],
            r["recall_count"],
            r["last_recalled_at"] or "",
            _preview(r["content"], 120),
        )
        for r in figures["most_recalled"]
    ]
    body = html(
        '<p class="status">database size: <strong>{mb:.2f} MB</strong> ({b} bytes)</p><div class="charts">'
        "{a}{b2}{c}{d}{e}</div><h2>Most recalled memories</h2>{t}",
        mb=size / 1e6,
        b=size,
        a=column_chart(figures["memories_per_day"], title="memories stored per day"),
        b2=column_chart(figures["episodes_per_day"], title="episodes archived per day"),
        c=bar_chart(figures["memories_per_agent"], title="memories per agent"),
        d=bar_chart(figures["episodes_per_agent"], title="episodes per agent"),
        e=bar_chart(figures["recalls_per_agent"], title="recalls per agent (sum of recall counts)"),
        t=table(("ref", "agent", "recalls", "last", "text"), recalled)
        if recalled
        else html('<p class="empty">nothing recalled yet</p>'),
    )
    return _page(state, "Charts", body, "stats")


ROUTES = (
    ("/", search, ("GET",)),
    ("/timeline", timeline, ("GET",)),
    ("/record/{kind}/{record_id}", record, ("GET",)),
    ("/record/{kind}/{record_id}/delete", confirm_delete, ("GET",)),
    ("/record/{kind}/{record_id}/{action}", change, ("POST",)),
    ("/profile", profile, ("GET",)),
    ("/graph", graph, ("GET",)),
    ("/health", health, ("GET",)),
    ("/stats", stats, ("GET",)),
)
