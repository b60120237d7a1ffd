"""``cpersona hook session-start | session-end``: Claude Code hooks, so memory is pushed, not waited for.

The hook protocol, as Claude Code's hooks reference documents it
(https://code.claude.com/docs/en/hooks, sections "Hook input", "SessionStart",
"SessionEnd", "Exit code output"):

- a command hook gets one JSON object on stdin: ``session_id``,
  ``transcript_path``, ``cwd``, ``hook_event_name`` and the event's own fields
  (SessionStart: ``source`` = startup | resume | clear | compact; SessionEnd:
  ``reason`` = clear | logout | prompt_input_exit | other ...);
- a SessionStart hook adds context by printing, with exit 0,
  ``{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "..."}}``
  (the same wire shape the Claude Agent SDKs write, e.g. hexdocs.pm/claude_code
  ``ClaudeCode.Hook.Output.SessionStart``);
- exit 0 is success; exit 2 and any other status are non-blocking for these
  two events: stderr is shown to the user and the session goes on. Context
  injected by a hook is capped at 10,000 characters, beyond which Claude Code
  keeps a file and shows the model a 2 KB preview (documented there, and seen in
  anthropics/claude-code#70460), so this hook stays below that whatever the
  token budget.

Failure policy: input that is not a hook's (a terminal, nothing, not JSON, not
an object, another event) adds no context and exits 0 with one line on stderr;
so does a database that does not exist yet. A real failure (configuration, a
database that cannot be opened, a refused tool) exits 1 with one line on
stderr, which Claude Code shows as a non-blocking hook error. stdout carries
the hook's JSON and nothing else.

Both hooks are deterministic and call no model: session-start quotes stored
rows through the read tools; session-end records only the session's boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK, EXIT_FAILED = 0, 1
DEFAULT_BUDGET = 2000  # tokens of additionalContext
CONTEXT_CHAR_CAP = 9_000  # below Claude Code's 10,000-character cap on injected hook output
DEFAULT_EPISODES = 5
RECONSTRUCT_COUNT = 5
STDIN_MAX_BYTES = 1 << 20
STDIN_WAIT_SECONDS = 2.0  # Claude Code may keep stdin open after writing the object
TRANSCRIPT_PEEK_BYTES = 64 * 1024
BOUNDARY_KEYWORD = "cpersona:session-end"
MIN_CUT_TOKENS = 16  # a line cut shorter than this says nothing; stop instead


def add_subcommands(commands: Any) -> None:
    hook = commands.add_parser("hook", help="Claude Code hooks: push memory into a session as it starts")
    events = hook.add_subparsers(dest="event", metavar="EVENT", required=True)

    start = events.add_parser(
        "session-start",
        help="print the SessionStart hook output: profile, what is known about the project, recent episodes",
    )
    start.add_argument("--agent", required=True, help="the agent whose memory is pushed")
    start.add_argument(
        "--project",
        default=None,
        help="project to read (default: the agent's [defaults] project in the operating context, else every project)",
    )
    start.add_argument(
        "--query",
        default=None,
        help="what reconstruct is asked (default: the project's name, else the working directory's name)",
    )
    start.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_BUDGET,
        help=f"most tokens of context to add (default {DEFAULT_BUDGET}; never more than {CONTEXT_CHAR_CAP} characters)",
    )
    start.add_argument(
        "--episodes", type=int, default=DEFAULT_EPISODES, help=f"recent episodes to list (default {DEFAULT_EPISODES})"
    )
    start.set_defaults(handler=lambda args: _hook(session_start, args, "SessionStart"))

    end = events.add_parser("session-end", help="record the session's end as an episode (no summary is made)")
    end.add_argument("--agent", required=True, help="the agent the session belongs to")
    end.add_argument("--project", default=None, help="project to file the record under (default: as session-start)")
    end.set_defaults(handler=lambda args: _hook(session_end, args, "SessionEnd"))


def _note(message: str) -> None:
    print(f"cpersona hook: {message}", file=sys.stderr)


def _hook(
    body: Callable[[argparse.Namespace, dict[str, Any], Any], dict[str, Any] | None],
    args: argparse.Namespace,
    event: str,
) -> int:
    from cpersona.admin_cli import _Exit
    from cpersona.tool_cli import ToolRefused, open_tools

    if event == "SessionStart" and args.budget < 1:
        _note("--budget must be at least 1 token")
        return EXIT_FAILED
    hook_input, problem = read_hook_input()
    if hook_input is None:
        _note(f"{problem}; nothing was done")
        return EXIT_OK
    named = hook_input.get("hook_event_name")
    if named is not None and named != event:
        _note(f"this is the {event} hook, but the input is for {named!r}; nothing was done")
        return EXIT_OK
    try:
        from cpersona.config import load_settings

        settings = load_settings()
        if event == "SessionStart" and not settings.database_url and not settings.db_file.exists():
            _note(f"no database at {settings.db_file} yet; no context added")
            return EXIT_OK
        with open_tools(must_exist=False) as tools:
            output = body(args, hook_input, tools)
    except ToolRefused as refused:
        _note(f"{refused.tool}: {refused}")
        return EXIT_FAILED
    except _Exit as stop:
        _note(str(stop))
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 — a hook answers in one line, never a traceback
        from cpersona.cli import failure_line

        _note(failure_line(exc))
        return EXIT_FAILED
    if output is not None:
        print(json.dumps(output, ensure_ascii=False))
    return EXIT_OK


# -- the input ---------------------------------------------------------------------------------


def read_hook_input(stream: Any = None, *, wait: float = STDIN_WAIT_SECONDS) -> tuple[dict[str, Any] | None, str]:
    """Claude Code's JSON object from stdin, else None and why; never blocks past ``wait`` seconds idle."""
    stream = stream if stream is not None else sys.stdin
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None, "no stdin"
    if os.isatty(fd):
        return None, "stdin is a terminal, not Claude Code's hook input"
    data = b""
    while len(data) <= STDIN_MAX_BYTES:
        try:
            ready, _, _ = select.select([fd], [], [], wait)
        except (OSError, ValueError):
            ready = [fd]  # a stream select cannot watch: read it plainly
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            return None, f"stdin cannot be read: {exc.strerror or exc}"
        if not chunk:
            break
        data += chunk
        if _json_object(data) is not None:  # the object is complete: don't wait for an EOF that may not come
            break
    if len(data) > STDIN_MAX_BYTES:
        return None, f"the hook input is over {STDIN_MAX_BYTES} bytes"
    if not data.strip():
        return None, "no hook input on stdin"
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"the hook input is not JSON ({exc})"
    if not isinstance(parsed, dict):
        return None, f"the hook input is a JSON {type(parsed).__name__}, not an object"
    return parsed, ""


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _text(hook_input: dict[str, Any], key: str) -> str:
    value = hook_input.get(key)
    return value if isinstance(value, str) else ""


def working_directory(hook_input: dict[str, Any]) -> str:
    return _text(hook_input, "cwd") or os.getcwd()


def choose_project(tools: Any, agent: str, explicit: str | None) -> tuple[str | None, str]:
    """The project_id to pass (None: every project) and its name for display.

    The server's own rule decides: with no --project, an agent the operating
    context maps to a default project reads it through ``@auto`` (the Hard
    layer, OC-8); the server has no rule mapping a directory to a project, so
    none is invented here.
    """
    if explicit is not None:
        return explicit, explicit
    context = tools.answer("get_operating_context")
    defaults = context.get("defaults") if context.get("ok") else None
    if isinstance(defaults, dict) and isinstance(defaults.get(agent), str):
        return "@auto", defaults[agent]
    return None, ""


# -- session-start -----------------------------------------------------------------------------


def session_start(args: argparse.Namespace, hook_input: dict[str, Any], tools: Any) -> dict[str, Any]:
    cwd = working_directory(hook_input)
    project, project_name = choose_project(tools, args.agent, args.project)
    query = args.query or project_name or os.path.basename(os.path.normpath(cwd)) or cwd
    scoped = {"project_id": project} if project is not None else {}

    profile = tools.call("get_profile", agent_id=args.agent).get("profile") or ""
    known = tools.call(
        "reconstruct",
        agent_id=args.agent,
        query=query,
        count=RECONSTRUCT_COUNT,
        budget=max(1, args.budget * 4),
        **scoped,
    )
    listed = tools.call("list_episodes", agent_id=args.agent, limit=max(0, args.episodes) * 4 + 10, **scoped)
    episodes = [e for e in listed.get("episodes", []) if BOUNDARY_KEYWORD not in (e.get("keywords") or "")]
    boundaries = [e for e in listed.get("episodes", []) if BOUNDARY_KEYWORD in (e.get("keywords") or "")]

    shown_project = known.get("resolved_project_id", project_name) if project is not None else ""
    where = f", project '{shown_project}'" if shown_project else ""
    source = _text(hook_input, "source")
    header = (
        f"Memory from cpersona for agent '{args.agent}'{where}"
        + (f" (session {source})" if source else "")
        + ": quoted from stored records; get_contents "
        "reads a ref (mem:12, ep:3) in full."
    )
    sections: list[tuple[str, list[str]]] = []
    if profile:
        sections.append(("## Profile", [profile]))
    boundary_refs = {f"ep:{e['id']}" for e in boundaries}
    items = [
        f"- [{item.get('head_ref', '-')}{_as_of(item)}] {_flat(item.get('content'))}"
        for item in known.get("items", [])
        if item.get("head_ref") not in boundary_refs
    ]
    if items:
        sections.append((f"## Stored about {query!r}", items))
    if episodes[: args.episodes]:
        sections.append(
            (
                "## Recent episodes",
                [
                    f"- [ep:{e['id']}, {_day(e.get('created_at'))}] {_flat(e.get('summary'))}"
                    for e in episodes[: args.episodes]
                ],
            )
        )
    if boundaries:
        last = boundaries[0]
        sections.append(
            (
                "## Last session",
                [
                    f"- [ep:{last['id']}, ended {last.get('end_time') or last.get('created_at')}] "
                    f"{_flat(last.get('summary'))}"
                ],
            )
        )
    if not sections:
        sections.append(("", ["Nothing is stored for this agent yet."]))
    context = fit_to_budget(header, sections, args.budget)
    return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}


def _flat(text: Any) -> str:
    return " ".join(str(text or "").split())


def _day(stamp: Any) -> str:
    return str(stamp or "")[:10] or "-"


def _as_of(item: dict[str, Any]) -> str:
    claims = item.get("claims") or []
    stamp = claims[0].get("as_of") if claims and isinstance(claims[0], dict) else None
    return f", {_day(stamp)}" if stamp else ""


def fit_to_budget(header: str, sections: list[tuple[str, list[str]]], budget: int) -> str:
    """Header and sections in order, whole lines while they fit ``budget`` tokens (and the character cap).

    The first line that does not fit is cut to what room is left, if that is
    worth reading, and a last line says the context was cut; nothing after it
    is added, so the same database and budget always give the same text.
    """
    from cpersona.services.reconstruct.tokens import count_tokens

    cut_note = f"(cut to the {budget}-token budget: ask recall or reconstruct for more)"
    room = budget - count_tokens("\n" + cut_note)

    def fits(text: str, limit: int) -> bool:
        return count_tokens(text) <= limit and len(text) <= CONTEXT_CHAR_CAP - len(cut_note) - 1

    lines = [header]
    if not fits(header, room):
        return _cut(header, lambda text: fits(text, budget) and len(text) <= CONTEXT_CHAR_CAP) or ""
    for heading, body in sections:
        for position, line in enumerate(body):
            block = ["", heading, line] if position == 0 and heading else [line]
            candidate = "\n".join([*lines, *block])
            if fits(candidate, room):
                lines.extend(block)
                continue
            prefix = "\n".join([*lines, *block[:-1]])
            if fits(prefix, room - MIN_CUT_TOKENS):
                cut = _cut(line, lambda text, prefix=prefix: fits(prefix + "\n" + text, room))
                if cut:
                    lines.extend([*block[:-1], cut])
            return "\n".join([*lines, cut_note])
    return "\n".join(lines)


def _cut(text: str, fits: Callable[[str], bool]) -> str:
    """The longest start of ``text`` (ending in …) that ``fits``; '' when none does."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(text[:middle].rstrip() + "…"):
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + "…" if low else ""


# -- session-end -------------------------------------------------------------------------------


def session_end(args: argparse.Namespace, hook_input: dict[str, Any], tools: Any) -> None:
    """Archive the session's boundary: which session ended, why, where, and where its transcript is.

    Nothing is summarised: the record names facts Claude Code handed over and
    the transcript's first and last timestamps (the episode's time span), so
    the next session-start can say when the last one ended and point at its
    transcript.
    """
    cwd = working_directory(hook_input)
    session = _text(hook_input, "session_id") or "(no session id)"
    reason = _text(hook_input, "reason") or "not given"
    transcript = _text(hook_input, "transcript_path")
    project, _ = choose_project(tools, args.agent, args.project)
    summary = f"Claude Code session {session} ended (reason: {reason}). Working directory: {cwd}."
    if transcript:
        summary += f" Transcript: {transcript}."
    history = [{"role": "system", "content": "", "timestamp": stamp} for stamp in transcript_span(transcript)]
    arguments: dict[str, Any] = {
        "agent_id": args.agent,
        "summary": summary,
        "history": history,
        "keywords": f"{BOUNDARY_KEYWORD} claude-code {session}",
    }
    if project is not None:
        arguments["project_id"] = project
    answer = tools.call("archive_episode", **arguments)
    if answer.get("persisted") is False:
        _note(f"the session's end was not recorded: {answer.get('reason')}")
    return None


def transcript_span(path: str) -> list[str]:
    """The first and last ``timestamp`` of a JSONL transcript, read from its two ends only (bounded)."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            head = handle.read(TRANSCRIPT_PEEK_BYTES)
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TRANSCRIPT_PEEK_BYTES))
            tail = handle.read(TRANSCRIPT_PEEK_BYTES)
    except OSError:
        return []
    first = next(
        (s for s in _stamps(head.split(b"\n")[:-1] if len(head) == TRANSCRIPT_PEEK_BYTES else head.split(b"\n"))), None
    )
    last = next(
        (s for s in _stamps(reversed(tail.split(b"\n")[1:] if size > TRANSCRIPT_PEEK_BYTES else tail.split(b"\n")))),
        None,
    )
    return [s for s in (first, last) if s]


def _stamps(lines: Any) -> Any:
    for line in lines:
        try:
            entry = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("timestamp"), str) and entry["timestamp"]:
            yield entry["timestamp"]
