"""LoCoMo evidence-retrieval benchmark over MCP, every server and embedding mode in one run.

For each embedding mode and each server: a fresh database; every turn of
every conversation stored (one agent per conversation) as
``"<speaker>: <text>"`` with its session time and ``id = dia_id``; every
scorable question recalled with ``limit 10``; the returned rows mapped back to
dia_ids and scored against the question's evidence (recall@5/@10, hit@10,
MRR, NDCG@10, averaged over questions). Plain BM25 over the same turns is
printed as the floor.

    python bench/locomo.py --servers ours,ref --modes none,minilm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from bm25 import BM25Index  # noqa: E402
from locomo_data import DEFAULT_DATA_DIR, Conversation, Session, load_conversations  # noqa: E402
from mcp_driver import (  # noqa: E402
    RunningServer,
    ToolCallError,
    embedding_env,
    start_server,
    write_results,
)
from metrics import METRIC_NAMES, average, percentile, score_question  # noqa: E402
from run_matrix import add_run_arguments, run_all  # noqa: E402

RECALL_LIMIT = 10


@dataclass
class RunResult:
    """One (server, mode) run: per-question scores plus what the run looked like."""

    server: str
    mode: str
    server_version: str = ""
    stored: int = 0
    embedded: int = 0
    episodes: int = 0  # episodes archived (the --episodes per-session variant)
    store_failures: list[str] = field(default_factory=list)
    recall_errors: list[str] = field(default_factory=list)
    unmapped_rows: int = 0
    recall_ms: list[float] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    aborted: str = ""  # why the run stopped early, if it did

    def summary(self) -> dict[str, Any]:
        scores = [q["scores"] for q in self.questions]
        by_category: dict[int, list[dict[str, float]]] = defaultdict(list)
        for question in self.questions:
            by_category[question["category"]].append(question["scores"])
        return {
            "server": self.server,
            "mode": self.mode,
            "server_version": self.server_version,
            "questions": len(scores),
            "metrics": average(scores),
            "by_category": {str(c): {"questions": len(s), **average(s)} for c, s in sorted(by_category.items())},
            "stored": self.stored,
            "embedded": self.embedded,
            "episodes": self.episodes,
            "store_failures": len(self.store_failures),
            "recall_errors": len(self.recall_errors),
            "unmapped_rows": self.unmapped_rows,
            "recall_p50_ms": percentile(self.recall_ms, 0.50),
            "recall_p95_ms": percentile(self.recall_ms, 0.95),
            "seconds": round(self.seconds, 1),
            "aborted": self.aborted or None,
        }


@dataclass
class TurnLookup:
    """Ways to recognise a stored turn in a recall row, most reliable first."""

    by_ref: dict[str, str]  # "mem:<row id>" from the store answer -> dia_id
    by_content: dict[str, str]  # the exact text stored -> dia_id
    dia_ids: frozenset[str]

    def dia_id_of(self, message: dict[str, Any]) -> str | None:
        ref = str(message.get("ref", ""))
        if ref in self.by_ref:
            return self.by_ref[ref]
        if message.get("id") in self.dia_ids:  # the caller id the row was stored under
            return str(message["id"])
        return self.by_content.get(str(message.get("content", "")))


def ranked_dia_ids(messages: list[dict[str, Any]], lookup: TurnLookup) -> tuple[list[str], int]:
    """Best-first dia_ids of a recall answer, and how many rows mapped to no turn.

    recall returns rows in ascending relevance (the last row is the best), so
    the list is reversed before anything else.
    """
    ranked: list[str] = []
    unmapped = 0
    for message in reversed(messages):
        dia_id = lookup.dia_id_of(message)
        if dia_id is None:
            unmapped += 1
        elif dia_id not in ranked:
            ranked.append(dia_id)
    return ranked, unmapped


async def archive_session(server: RunningServer, conversation: Conversation, session: Session, run: RunResult) -> None:
    """The episode variant: the session's summary archived as an episode, stamped with the session's time."""
    if not session.summary:
        return
    arguments = {
        "agent_id": conversation.agent_id,
        "summary": session.summary,
        "history": [{"role": "user", "content": f"session {session.number}", "timestamp": session.timestamp}],
    }
    try:
        answer = await server.call("archive_episode", arguments)
    except ToolCallError as exc:
        answer = {"tool_error": str(exc)}
    if answer.get("ok") is False or "tool_error" in answer:
        run.store_failures.append(f"{conversation.name}/episode {session.number}: {json.dumps(answer)[:200]}")
    else:
        run.episodes += 1


async def store_conversation(
    server: RunningServer, conversation: Conversation, run: RunResult, *, episodes: bool = False
) -> dict[str, str]:
    """Store every turn in order (and, with ``episodes``, archive each session after its turns);
    returns {"mem:<row id>": dia_id}."""
    dia_id_by_ref: dict[str, str] = {}
    session_ends = {session.last_dia_id: session for session in conversation.sessions} if episodes else {}
    for turn in conversation.turns:
        arguments = {
            "agent_id": conversation.agent_id,
            "content": turn.content,
            "id": turn.dia_id,
            "timestamp": turn.timestamp,
        }
        try:
            answer = await server.call("store", arguments)
        except ToolCallError as exc:
            answer = {"tool_error": str(exc)}
        if answer.get("ok") is True and answer.get("result") == "stored":
            dia_id_by_ref[f"mem:{answer['id']}"] = turn.dia_id
            run.stored += 1
            run.embedded += bool(answer.get("embedded"))
        else:
            run.store_failures.append(f"{conversation.name}/{turn.dia_id}: {json.dumps(answer)[:200]}")
        if (session := session_ends.get(turn.dia_id)) is not None:
            await archive_session(server, conversation, session, run)
    return dia_id_by_ref


async def run_server(
    run: RunResult,
    embed_url: str | None,
    conversations: list[Conversation],
    extra_settings: dict[str, str] | None = None,
    *,
    episodes: bool = False,
) -> None:
    """Fill `run` with one server's answers; a server that dies mid-run leaves what it answered so far."""
    name, mode = run.server, run.mode
    extra_settings = extra_settings or {}
    started = time.perf_counter()
    settings = {**embedding_env(mode, embed_url), **(extra_settings if name.startswith("ours") else {})}
    async with start_server(name, settings) as server:
        run.server_version = str(server.server_info.get("version", ""))
        for conversation in conversations:
            lookup = TurnLookup(
                by_ref=await store_conversation(server, conversation, run, episodes=episodes),
                by_content={turn.content: turn.dia_id for turn in conversation.turns},
                dia_ids=frozenset(turn.dia_id for turn in conversation.turns),
            )
            for question in conversation.questions:
                arguments = {"agent_id": conversation.agent_id, "query": question.question, "limit": RECALL_LIMIT}
                try:
                    answer, elapsed_ms = await server.timed_call("recall", arguments)
                    run.recall_ms.append(elapsed_ms)
                except ToolCallError as exc:  # scored as an empty answer, and counted
                    answer = {"tool_error": str(exc)}
                if "messages" not in answer or answer.get("ok") is False:
                    run.recall_errors.append(f"{conversation.name}: {question.question}: {json.dumps(answer)[:200]}")
                ranked, unmapped = ranked_dia_ids(answer.get("messages") or [], lookup)
                run.unmapped_rows += unmapped
                run.questions.append(
                    {
                        "conversation": conversation.name,
                        "question": question.question,
                        "category": question.category,
                        "evidence": list(question.evidence),
                        "ranked": ranked,
                        "scores": score_question(ranked, question.evidence),
                    }
                )
            print(
                f"  [{mode}/{name}] conversation {conversation.name}: {len(conversation.turns)} turns, "
                f"{len(conversation.questions)} questions",
                file=sys.stderr,
                flush=True,
            )
    run.seconds = time.perf_counter() - started


def bm25_floor(conversations: list[Conversation], **options: Any) -> dict[str, Any]:
    scores = []
    for conversation in conversations:
        index = BM25Index([t.dia_id for t in conversation.turns], [t.content for t in conversation.turns], **options)
        scores.extend(
            score_question(index.search(q.question, RECALL_LIMIT), q.evidence) for q in conversation.questions
        )
    return {"questions": len(scores), "metrics": average(scores)}


def embedder_health(url: str) -> dict[str, Any]:
    health_url = url.rsplit("/", 1)[0] + "/health"
    with urllib.request.urlopen(health_url, timeout=10) as response:
        return json.loads(response.read())


def format_table(summaries: list[dict[str, Any]], floors: dict[str, dict[str, Any]]) -> str:
    header = (
        f"{'mode':<8} {'server':<18} "
        + " ".join(f"{m:>9}" for m in METRIC_NAMES)
        + f" {'rc p50 ms':>10} {'embedded':>9}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        metrics = " ".join(f"{s['metrics'][m]:>9.3f}" for m in METRIC_NAMES)
        embedded = f"{s['embedded']}/{s['stored']}"
        flags = []
        if s["aborted"]:
            flags.append("ABORTED")
        if s["recall_errors"] or s["store_failures"]:
            flags.append(f"{s['store_failures']} store / {s['recall_errors']} recall errors")
        note = f"  ({'; '.join(flags)})" if flags else ""
        lines.append(f"{s['mode']:<8} {s['server']:<18} {metrics} {s['recall_p50_ms']:>10.1f} {embedded:>9}{note}")
    for label, floor in floors.items():
        metrics = " ".join(f"{floor['metrics'][m]:>9.3f}" for m in METRIC_NAMES)
        lines.append(f"{'-':<8} {label:<18} {metrics}")
    return "\n".join(lines)


def format_categories(summaries: list[dict[str, Any]]) -> str:
    categories = sorted({c for s in summaries for c in s["by_category"]})
    header = f"{'mode':<8} {'server':<18} " + " ".join(f"{'cat ' + c + ' R@10':>12}" for c in categories)
    lines = [header]
    for s in summaries:
        cells = " ".join(f"{s['by_category'].get(c, {}).get('recall@10', 0.0):>12.3f}" for c in categories)
        lines.append(f"{s['mode']:<8} {s['server']:<18} {cells}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    conversations = load_conversations(args.data)
    if args.conversations:
        wanted = set(args.conversations.split(","))
        conversations = [c for c in conversations if c.name in wanted]
    turns = sum(len(c.turns) for c in conversations)
    questions = sum(len(c.questions) for c in conversations)
    print(
        f"LoCoMo: {len(conversations)} conversations, {turns} turns, {questions} scorable questions "
        f"({sum(c.skipped_questions for c in conversations)} skipped: adversarial or no evidence), limit {RECALL_LIMIT}",
        flush=True,
    )
    settings = dict(item.split("=", 1) for item in args.setting)
    embedders: dict[str, Any] = {}

    async def run_one(run: RunResult, embed_url: str | None) -> None:
        await run_server(run, embed_url, conversations, settings, episodes=args.episodes == "per-session")

    def after_mode(mode: str, embed_url: str | None) -> None:
        if embed_url:
            embedders[mode] = embedder_health(embed_url)

    runs = await run_all(args, lambda name, mode: RunResult(server=name, mode=mode), run_one, after_mode)
    floors = {
        "bm25": bm25_floor(conversations),
        "bm25 (all tokens)": bm25_floor(conversations, stop_words=frozenset()),
    }
    summaries = [run.summary() for run in runs]
    print()
    print(format_table(summaries, floors))
    print()
    print(format_categories(summaries))
    for run in runs:
        for problem in (run.store_failures + run.recall_errors)[:5]:
            print(f"  ! {run.mode}/{run.server}: {problem}")
    path = write_results(
        "locomo",
        {
            "benchmark": "locomo",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data": str(args.data),
            "conversations": [c.name for c in conversations],
            "turns": turns,
            "recall_limit": RECALL_LIMIT,
            "settings_ours": settings,
            "episodes": args.episodes,
            "runs": summaries,
            "floors": floors,
            "embedders": embedders,
            "per_question": {f"{r.mode}/{r.server}": r.questions for r in runs} if args.per_question else None,
        },
    )
    print(f"\nresults written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, servers="ours, ours-pg, ref", default_modes="none,minilm")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="directory of LoCoMo *.json files")
    parser.add_argument("--conversations", default="", help="comma list of file stems to keep (default: all)")
    parser.add_argument(
        "--episodes",
        choices=("none", "per-session"),
        default="none",
        help="per-session: after each session's turns, archive its summary (session_<n>_summary) as an episode",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="CPERSONA_X=VALUE",
        help="an extra setting for our server only (repeatable), e.g. CPERSONA_RECALL_MODE=rsf",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
