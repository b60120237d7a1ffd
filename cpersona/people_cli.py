"""``cpersona search | list | show | delete``: the memory, read and pruned by a person at a terminal.

Each command is a client of the MCP tools (:mod:`cpersona.tool_cli`), with the
rules an agent's call meets (an agent sees only its own rows): search is
``recall``, delete is ``delete_memory`` or ``delete_episode``. list and show
read what the web page reads (:mod:`cpersona.services.records.browse`: the
timeline, filtered and paged in storage, and one record whole) once the tools
have allowed the read: the listing tools for the agent asked, ``get_contents``
for the record. Output is
plain text for people; ``--json`` prints the tools' answers for scripts. Exit
status: 0 done, 1 the tool refused or found nothing, 2 a command line or
configuration that cannot be used, 3 a database this build must not open;
every failure is one line on stderr.

Times are shown, and ``--since`` dates read, in this machine's local time zone.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LIST_DEFAULT = 50
LINE_CHARS = 110  # one listed row per terminal line
# --type: (the listing tool whose rules allow the read, its key, the ref prefix)
LIST_TOOLS = {"memory": ("list_memories", "memories", "mem"), "episode": ("list_episodes", "episodes", "ep")}
_RELATIVE = re.compile(r"(\d{1,5})([hdw])")


def add_subcommands(commands: Any) -> None:
    search = commands.add_parser("search", help="search one agent's memories and episodes (the recall tool)")
    search.add_argument("query", help="what to look for")
    search.add_argument("--agent", required=True, help="the agent whose memory is searched")
    search.add_argument("--limit", type=int, default=10, help="at most this many rows (default 10, at most 100)")
    search.add_argument("--project", default=None, help="only this project (and the global pool)")
    search.add_argument("--json", action="store_true", help="print the recall tool's answer as JSON")
    search.set_defaults(handler=lambda args: _run(_search, args))

    listing = commands.add_parser("list", help="list the newest memories and episodes, optionally since a date")
    listing.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only rows stored since: a date (2026-12-01), today, yesterday, or 12h / 7d / 2w ago",
    )
    listing.add_argument("--agent", default=None, help="only this agent's rows (default: every agent)")
    listing.add_argument("--type", choices=tuple(LIST_TOOLS), default=None, help="only memories or only episodes")
    listing.add_argument("--project", default=None, help="only this project (exactly; the global pool is '')")
    listing.add_argument(
        "--limit", type=int, default=LIST_DEFAULT, help=f"rows on this page (default {LIST_DEFAULT}, at most 500)"
    )
    listing.add_argument("--offset", type=int, default=0, help="skip this many of the newest rows (the next page)")
    listing.add_argument("--json", action="store_true", help="print the rows as JSON")
    listing.set_defaults(handler=lambda args: _run(_list, args))

    show = commands.add_parser("show", help="print one record in full: its fields, ranges, entities, relations")
    show.add_argument("ref", help="the record: mem:12 or ep:3")
    show.add_argument("--agent", required=True, help="the agent the record belongs to")
    show.add_argument(
        "--json",
        action="store_true",
        help='print the get_contents answer, with the whole record under "record", as JSON',
    )
    show.set_defaults(handler=lambda args: _run(_show, args))

    delete = commands.add_parser("delete", help="delete one memory or episode (asks first, unless --yes)")
    delete.add_argument("ref", help="the record: mem:12 or ep:3")
    delete.add_argument(
        "--agent", default=None, help="refuse unless the record belongs to this agent (and show it before asking)"
    )
    delete.add_argument("--yes", action="store_true", help="delete without asking (required without a terminal)")
    delete.add_argument("--json", action="store_true", help="print the delete tool's answer as JSON")
    delete.set_defaults(handler=lambda args: _run(_delete, args))


class _Usage(Exception):
    """A command line that cannot be carried out; nothing was read or changed."""


def _run(body: Callable[[argparse.Namespace, Any], int], args: argparse.Namespace) -> int:
    from cpersona.admin_cli import _Exit
    from cpersona.tool_cli import ToolRefused, open_tools, say

    try:
        with open_tools() as tools:
            return body(args, tools)
    except _Usage as problem:
        say(str(problem))
        return EXIT_USAGE
    except ToolRefused as refused:
        if getattr(args, "json", False):
            from cpersona.tool_cli import print_json

            print_json(refused.answer)
        say(f"{refused.tool}: {refused}")
        return EXIT_FAILED
    except _Exit as stop:
        say(str(stop))
        return stop.status


def parse_ref_argument(value: str) -> Any:
    from cpersona.services.refs import parse_ref

    ref = parse_ref(value, trim=True)
    if ref is None or not ref.in_range:
        raise _Usage(f"{value!r} is not a record ref: write mem:12 for a memory or ep:3 for an episode")
    return ref


# -- rendering ---------------------------------------------------------------------------------


def local_time(stamp: Any) -> str:
    """A stored stamp as local wall-clock minutes; anything unreadable as it is."""
    from cpersona.services.timestamps import parse_iso

    moment = parse_iso(stamp) if isinstance(stamp, str) and stamp else None
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else str(stamp or "-")


def one_line(text: Any, width: int) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def indented(text: Any, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in str(text or "").splitlines() or [""])


def _advisory_note(answer: dict[str, Any]) -> None:
    advisory = answer.get("advisory")
    if isinstance(advisory, dict) and advisory.get("reason"):
        print(f"note: {advisory['reason']}", file=sys.stderr)


# -- search ------------------------------------------------------------------------------------


def _search(args: argparse.Namespace, tools: Any) -> int:
    arguments: dict[str, Any] = {"agent_id": args.agent, "query": args.query, "limit": args.limit}
    if args.project is not None:
        arguments["project_id"] = args.project
    answer = tools.call("recall", **arguments)
    if args.json:
        from cpersona.tool_cli import print_json

        print_json(answer)
        return EXIT_OK
    rows = list(reversed(answer.get("messages", [])))  # recall answers best last; a person reads best first
    _advisory_note(answer)
    if not rows:
        print(f"no match for {args.query!r} in the memory of agent {args.agent!r}")
        return EXIT_OK
    for number, row in enumerate(rows, 1):
        reason = row.get("match_reason") or {}
        score = f"  score {reason['score']:.3f} ({reason.get('signal')})" if "score" in reason else ""
        print(f"{number}. {row.get('ref', '-')}  {local_time(row.get('timestamp'))}{score}")
        print(indented(row.get("excerpt") or row.get("content")))
        if row.get("excerpt"):
            print(f"    (excerpt; the whole record: cpersona show {row.get('ref')} --agent {args.agent})")
    return EXIT_OK


# -- list --------------------------------------------------------------------------------------


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """The instant ``--since`` names, as an aware datetime (dates at local midnight)."""
    from cpersona.services.timestamps import parse_iso

    now = (now or datetime.now().astimezone()).astimezone()
    text = value.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if text == "today":
        return midnight
    if text == "yesterday":
        return midnight - timedelta(days=1)
    if match := _RELATIVE.fullmatch(text):
        amount, unit = int(match.group(1)), match.group(2)
        return now - timedelta(hours=amount * {"h": 1, "d": 24, "w": 168}[unit])
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        moment = None
    if moment is None or parse_iso(value.strip()) is None:
        raise _Usage(
            f"--since {value!r}: give a date (2026-12-01), a time (2026-12-01T09:30), today, "
            "yesterday, or an age such as 12h, 7d, 2w"
        )
    return moment.astimezone() if moment.tzinfo is None else moment  # a naive time is local, as a date is


def _list(args: argparse.Namespace, tools: Any) -> int:
    """The page's own timeline (:func:`cpersona.services.records.browse.timeline`): filtered in storage, paged."""
    from datetime import timezone

    from cpersona.services.records import browse
    from cpersona.storage.repositories.browse import TimelineFilter

    if not 1 <= args.limit <= browse.TIMELINE_MAX_ROWS:
        raise _Usage(f"--limit must be 1 to {browse.TIMELINE_MAX_ROWS}")
    if args.offset < 0:
        raise _Usage("--offset must be 0 or more")
    since = parse_since(args.since) if args.since else None
    kinds = [args.type] if args.type else list(LIST_TOOLS)
    for kind in kinds:
        # The listing tool decides who may read which agent (argument checks, the ACL): a refusal stops here.
        probe: dict[str, Any] = {"limit": 1}
        if args.agent is not None:
            probe["agent_id"] = args.agent
        tools.call(LIST_TOOLS[kind][0], **probe)
    wanted = TimelineFilter(
        agent_id=args.agent,
        project_id=args.project,
        since=since.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if since else "",
        kinds=tuple(LIST_TOOLS[kind][2] for kind in kinds),
    )
    page = browse.timeline(tools.app, wanted, args.limit, args.offset, with_facets=False)
    kind_of = {prefix: kind for kind, (_, _, prefix) in LIST_TOOLS.items()}
    rows = [{"type": kind_of[row["kind"]], "ref": f"{row['kind']}:{row['id']}", **row} for row in page["rows"]]
    next_offset = args.offset + len(rows) if page["truncated"] else None
    if args.json:
        from cpersona.tool_cli import print_json

        print_json(
            {
                "ok": True,
                "rows": rows,
                "count": len(rows),
                "complete": next_offset is None,
                "offset": args.offset,
                "next_offset": next_offset,
                "since": since.isoformat() if since else None,
            }
        )
        return EXIT_OK
    if not rows:
        window = f" since {since:%Y-%m-%d %H:%M}" if since else ""
        where = " past --offset" if args.offset else ""
        print(f"nothing stored{window}" + (f" for agent {args.agent!r}" if args.agent is not None else "") + where)
        return EXIT_OK
    for row in rows:
        bucket = row.get("project_id") or "-"
        if row.get("channel"):
            bucket += f"/{row['channel']}"
        lock = " [locked]" if row.get("locked") else ""
        head = f"{row['ref']:<9} {local_time(row.get('created_at'))}  {row.get('agent_id')}  {bucket}{lock}  "
        print(head + one_line(row.get("text"), max(LINE_CHARS - len(head), 20)))
    if next_offset is not None:
        print(f"(more rows follow: the next {args.limit} with --offset {next_offset})", file=sys.stderr)
    return EXIT_OK


# -- show --------------------------------------------------------------------------------------


def visible_record(tools: Any, ref: Any, agent: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """get_contents' answer and, when it shows ``agent`` the record, the page's whole read of it."""
    from cpersona.services.records import browse

    # get_contents decides what this agent may see (ownership, the ACL); the page's record read adds the rest.
    answer = tools.call("get_contents", agent_id=agent, refs=[ref.canonical])
    full = browse.record(tools.app, ref.kind, ref.id) if answer.get("items") else None
    if full is not None and full["fields"].get("agent_id") != agent:
        full = None  # gone and its id reused between the two reads
    return answer, full


def _show(args: argparse.Namespace, tools: Any) -> int:
    ref = parse_ref_argument(args.ref)
    answer, full = visible_record(tools, ref, args.agent)
    if full is None:
        if args.json:
            from cpersona.tool_cli import print_json

            print_json(answer)
        from cpersona.tool_cli import say

        say(f"{ref.canonical}: agent {args.agent!r} has no such record")
        return EXIT_FAILED
    if args.json:
        from cpersona.tool_cli import print_json

        print_json({**answer, "record": full})
    else:
        print(render_full_record(full))
    return EXIT_OK


def render_full_record(found: dict[str, Any]) -> str:
    """A record as :func:`cpersona.services.records.browse.record` reads it, for a terminal."""
    fields = found["fields"]
    memory = found["kind"] == "mem"
    lines = [
        found["ref"],
        f"agent      {fields.get('agent_id')}",
        f"project    {fields.get('project_id') or '-'}",
        f"channel    {fields.get('channel') or '-'}",
        f"stored     {local_time(fields.get('created_at'))}",
    ]
    if memory:
        lines.append(f"time       {local_time(fields.get('timestamp'))}")
        lines.append(f"locked     {'yes' if fields.get('locked') else 'no'}")
        recall = found["recall"] or {}
        last = local_time(recall["last_recalled_at"]) if recall.get("last_recalled_at") else "never"
        lines.append(f"recalled   {recall.get('count') or 0} time(s), last {last}")
    else:
        span = f"{local_time(fields.get('start_time'))} to {local_time(fields.get('end_time'))}"
        lines += [
            f"span       {span}",
            f"resolved   {'yes' if fields.get('resolved') else 'no'}",
            "recalled   (episodes keep no recall counter)",
        ]
        if fields.get("keywords"):
            lines.append(f"keywords   {one_line(fields['keywords'], LINE_CHARS - 11)}")
    source = fields.get("source")
    if isinstance(source, dict):
        source = " ".join(f"{k}={v}" for k, v in source.items() if v)
    if memory:
        lines.append(f"source     {source or '-'}")
    lines.append(f"vector     {'yes' if fields.get('embedded') else 'no'}")
    ranges = found["ranges"]
    lines.append(f"ranges     {len(ranges)}" + ("" if ranges else " (short enough to be one range)"))
    lines += [
        f"  #{r['index']:<3} chars {r['start']}-{r['end']}, {r['tokens']} tokens, "
        f"{'embedded' if r['embedded'] else 'no vector'}"
        for r in ranges
    ]
    entities = [e["name"] + (f" (also {', '.join(e['aliases'])})" if e["aliases"] else "") for e in found["entities"]]
    lines.append(f"entities   {'; '.join(entities) if entities else 'none'}")
    lines.append(f"relations  {len(found['relations']) or 'none'}")
    lines += [f"  {_end_name(r['subject'])} --{r['predicate']}--> {_end_name(r['object'])}" for r in found["relations"]]
    lines += ["", str(fields.get("content") if memory else fields.get("summary") or "")]
    return "\n".join(lines)


def _end_name(end: dict[str, Any]) -> str:
    return str(end.get("name")) if end.get("kind") == "entity" else str(end.get("ref"))


# -- delete ------------------------------------------------------------------------------------


def _delete(args: argparse.Namespace, tools: Any) -> int:
    from cpersona.tool_cli import print_json, say

    ref = parse_ref_argument(args.ref)
    if not args.yes:
        if not sys.stdin.isatty():
            raise _Usage(
                f"not deleting {ref.canonical}: stdin is not a terminal, so nobody can confirm; pass --yes to delete"
            )
        if args.agent is not None:
            _, found = visible_record(tools, ref, args.agent)
            if found is None:
                say(f"{ref.canonical}: agent {args.agent!r} has no such record; nothing was deleted")
                return EXIT_FAILED
            print(render_full_record(found), file=sys.stderr)
        print(f"Delete {ref.canonical}? This cannot be undone. [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            say("nothing was deleted")
            return EXIT_FAILED
    tool, key = ("delete_memory", "memory_id") if ref.kind == "mem" else ("delete_episode", "episode_id")
    arguments: dict[str, Any] = {key: ref.id}
    if args.agent is not None:
        arguments["agent_id"] = args.agent
    answer = tools.call(tool, **arguments)
    if args.json:
        print_json(answer)
    if answer.get("persisted") is False:  # a no-persist pause answered instead of deleting
        say(f"nothing was deleted: {answer.get('reason')}")
        return EXIT_FAILED
    if not args.json:
        print(f"deleted {ref.canonical}")
    return EXIT_OK
