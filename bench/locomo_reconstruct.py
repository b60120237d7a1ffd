"""LoCoMo through `reconstruct`: does the quoted evidence hold the evidence turns?

Same data, storage and servers as ``locomo.py`` (every turn stored as
``"<speaker>: <text>"`` with its session time and ``id = dia_id``, one agent
per conversation, a fresh database per server and mode). Each scorable
question is then asked twice on the same database:

- ``reconstruct(agent_id, query)`` with every bound at its default (count,
  top_k, character budget): the answer a client gets when it follows the
  recommended reader;
- ``recall(agent_id, query, limit=10)``, as ``locomo.py`` asks it, so the two
  readers are compared on one run.

reconstruct is scored on what it *quotes* — item heads and admitted excerpts,
the text a client actually reads — and, separately, on what it *cites* (every
claim ref, quoted or not). Per question, then averaged:

- ``quoted_recall``  = |evidence ∩ quoted turns| / |evidence|
- ``quoted_all``     = 1 when every evidence turn is quoted
- ``quoted_hit``     = 1 when at least one is quoted
- ``cited_recall``   = |evidence ∩ claim refs| / |evidence|
- ``chars``          = characters of quoted text (reconstruct) or of returned
  ``content`` (recall), to put the evidence next to what it cost to read.

Recall is scored with ``metrics.score_question`` (recall@10, hit@10, MRR) plus
the same ``quoted_*`` figures over its 10 rows (every row's content is read).

    python bench/locomo_reconstruct.py --servers ours,ref --modes none
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from locomo import RECALL_LIMIT, TurnLookup, ranked_dia_ids, store_conversation  # noqa: E402
from locomo_data import DEFAULT_DATA_DIR, Conversation, load_conversations  # noqa: E402
from mcp_driver import ToolCallError, embedding_env, start_server, write_results  # noqa: E402
from metrics import average, percentile, score_question  # noqa: E402
from run_matrix import add_run_arguments, run_all  # noqa: E402

COVERAGE_NAMES = ("quoted_recall", "quoted_all", "quoted_hit", "cited_recall")


def coverage(quoted: set[str], cited: set[str], evidence: tuple[str, ...]) -> dict[str, float]:
    wanted = set(evidence)
    found = wanted & quoted
    return {
        "quoted_recall": len(found) / len(wanted),
        "quoted_all": 1.0 if found == wanted else 0.0,
        "quoted_hit": 1.0 if found else 0.0,
        "cited_recall": len(wanted & cited) / len(wanted),
    }


def reconstruct_refs(answer: dict[str, Any]) -> tuple[list[str], list[str], int]:
    """(quoted refs in reading order, cited refs, characters quoted) of a reconstruct answer."""
    quoted: list[str] = []
    cited: list[str] = []
    chars = 0
    for item in answer.get("items") or []:
        quoted.append(str(item.get("head_ref", "")))
        chars += len(str(item.get("content", "")))
        for excerpt in item.get("excerpts") or []:
            quoted.append(str(excerpt.get("ref", "")))
            chars += len(str(excerpt.get("content", "")))
        claims = item.get("claims")
        if claims is None:  # the lite/mode shape: a lone head claim becomes `as_of`
            cited.append(str(item.get("head_ref", "")))
        for claim in claims or []:
            cited.append(str(claim.get("ref", "")))
    return quoted, cited, chars


def to_dia_ids(refs: list[str], lookup: TurnLookup) -> list[str]:
    out: list[str] = []
    for ref in refs:
        dia_id = lookup.by_ref.get(ref)
        if dia_id is not None and dia_id not in out:
            out.append(dia_id)
    return out


@dataclass
class Run:
    server: str
    mode: str
    server_version: str = ""
    stored: int = 0
    embedded: int = 0
    store_failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    reconstruct_ms: list[float] = field(default_factory=list)
    recall_ms: list[float] = field(default_factory=list)
    shortfall: Counter = field(default_factory=Counter)
    independence: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    aborted: str = ""

    def summary(self) -> dict[str, Any]:
        def avg(key: str, names: tuple[str, ...]) -> dict[str, float]:
            rows = [q[key] for q in self.questions]
            return {n: (sum(r[n] for r in rows) / len(rows) if rows else 0.0) for n in names}

        by_category: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for q in self.questions:
            by_category[q["category"]].append(q)
        return {
            "server": self.server,
            "mode": self.mode,
            "server_version": self.server_version,
            "questions": len(self.questions),
            "reconstruct": {
                **avg("reconstruct", COVERAGE_NAMES),
                "items_mean": _mean([q["reconstruct_items"] for q in self.questions]),
                "claims_mean": _mean([q["reconstruct_claims"] for q in self.questions]),
                "chars_mean": _mean([q["reconstruct_chars"] for q in self.questions]),
                "p50_ms": percentile(self.reconstruct_ms, 0.50),
                "p95_ms": percentile(self.reconstruct_ms, 0.95),
                "shortfall_reason": dict(self.shortfall),
                "independence_reason": dict(self.independence),
            },
            "recall": {
                **avg("recall", COVERAGE_NAMES),
                **average([q["recall_scores"] for q in self.questions]),
                "chars_mean": _mean([q["recall_chars"] for q in self.questions]),
                "p50_ms": percentile(self.recall_ms, 0.50),
            },
            "by_category": {
                str(c): {
                    "questions": len(qs),
                    "reconstruct_quoted_recall": _mean([q["reconstruct"]["quoted_recall"] for q in qs]),
                    "recall_recall@10": _mean([q["recall_scores"]["recall@10"] for q in qs]),
                }
                for c, qs in sorted(by_category.items())
            },
            "stored": self.stored,
            "embedded": self.embedded,
            "store_failures": len(self.store_failures),
            "errors": len(self.errors),
            "seconds": round(self.seconds, 1),
            "aborted": self.aborted or None,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


async def ask(server: Any, tool: str, arguments: dict[str, Any], run: Run, timings: list[float]) -> dict[str, Any]:
    try:
        answer, elapsed = await server.timed_call(tool, arguments)
        timings.append(elapsed)
    except ToolCallError as exc:  # scored as an empty answer, and counted
        answer = {"tool_error": str(exc)}
    if answer.get("ok") is False or "tool_error" in answer:
        run.errors.append(f"{tool}: {arguments.get('query', '')!r}: {json.dumps(answer)[:200]}")
    return answer


async def run_server(run: Run, embed_url: str | None, conversations: list[Conversation]) -> None:
    started = time.perf_counter()
    async with start_server(run.server, embedding_env(run.mode, embed_url)) as server:
        run.server_version = str(server.server_info.get("version", ""))
        for conversation in conversations:
            # store_conversation counts into a locomo.RunResult-like object: stored/embedded/store_failures.
            lookup = TurnLookup(
                by_ref=await store_conversation(server, conversation, run),  # type: ignore[arg-type]
                by_content={turn.content: turn.dia_id for turn in conversation.turns},
                dia_ids=frozenset(turn.dia_id for turn in conversation.turns),
            )
            for question in conversation.questions:
                base = {"agent_id": conversation.agent_id, "query": question.question}
                rx = await ask(server, "reconstruct", base, run, run.reconstruct_ms)
                rc = await ask(server, "recall", {**base, "limit": RECALL_LIMIT}, run, run.recall_ms)
                quoted_refs, cited_refs, rx_chars = reconstruct_refs(rx)
                quoted = to_dia_ids(quoted_refs, lookup)
                cited = to_dia_ids(cited_refs, lookup)
                if rx.get("shortfall_reason"):
                    run.shortfall[str(rx["shortfall_reason"])] += 1
                for item in rx.get("items") or []:
                    run.independence[str(item.get("independence_reason", "singleton"))] += 1
                messages = rc.get("messages") or []
                ranked, _ = ranked_dia_ids(messages, lookup)
                run.questions.append(
                    {
                        "conversation": conversation.name,
                        "question": question.question,
                        "category": question.category,
                        "evidence": list(question.evidence),
                        "quoted": quoted,
                        "reconstruct": coverage(set(quoted), set(cited), question.evidence),
                        "reconstruct_items": len(rx.get("items") or []),
                        "reconstruct_claims": len(cited_refs),
                        "reconstruct_chars": rx_chars,
                        "ranked": ranked,
                        "recall": coverage(set(ranked), set(ranked), question.evidence),
                        "recall_scores": score_question(ranked, question.evidence),
                        "recall_chars": sum(len(str(m.get("content", ""))) for m in messages),
                    }
                )
            print(
                f"  [{run.mode}/{run.server}] conversation {conversation.name}: "
                f"{len(conversation.turns)} turns, {len(conversation.questions)} questions",
                file=sys.stderr,
                flush=True,
            )
    run.seconds = time.perf_counter() - started


def format_table(summaries: list[dict[str, Any]]) -> str:
    header = (
        f"{'mode':<7} {'server':<6} {'reader':<12} {'quoted_rec':>10} {'all_quoted':>10} {'any_quoted':>10} "
        f"{'cited_rec':>10} {'chars':>7} {'items':>6} {'p50 ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        rx, rc = s["reconstruct"], s["recall"]
        note = "  ABORTED" if s["aborted"] else (f"  ({s['errors']} errors)" if s["errors"] else "")
        lines.append(
            f"{s['mode']:<7} {s['server']:<6} {'reconstruct':<12} {rx['quoted_recall']:>10.3f} {rx['quoted_all']:>10.3f} "
            f"{rx['quoted_hit']:>10.3f} {rx['cited_recall']:>10.3f} {rx['chars_mean']:>7.0f} {rx['items_mean']:>6.1f} "
            f"{rx['p50_ms']:>8.1f}{note}"
        )
        lines.append(
            f"{s['mode']:<7} {s['server']:<6} {'recall@10':<12} {rc['quoted_recall']:>10.3f} {rc['quoted_all']:>10.3f} "
            f"{rc['quoted_hit']:>10.3f} {rc['cited_recall']:>10.3f} {rc['chars_mean']:>7.0f} {10:>6} {rc['p50_ms']:>8.1f}"
        )
    return "\n".join(lines)


def format_details(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for s in summaries:
        rx = s["reconstruct"]
        cats = ", ".join(
            f"cat {c}: rx {v['reconstruct_quoted_recall']:.3f} / rc {v['recall_recall@10']:.3f}"
            for c, v in s["by_category"].items()
        )
        lines.append(f"{s['mode']}/{s['server']}: {cats}")
        lines.append(f"  shortfall_reason {rx['shortfall_reason']}; independence_reason {rx['independence_reason']}")
        lines.append(
            f"  claims per answer {rx['claims_mean']:.1f}; reconstruct p95 {rx['p95_ms']:.1f} ms; run {s['seconds']} s"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    conversations = load_conversations(args.data)
    if args.conversations:
        wanted = set(args.conversations.split(","))
        conversations = [c for c in conversations if c.name in wanted]
    print(
        f"LoCoMo reconstruct: {len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} turns, "
        f"{sum(len(c.questions) for c in conversations)} scorable questions; reconstruct at defaults vs recall limit {RECALL_LIMIT}",
        flush=True,
    )

    async def run_one(run: Run, embed_url: str | None) -> None:
        await run_server(run, embed_url, conversations)

    runs = await run_all(args, lambda name, mode: Run(server=name, mode=mode), run_one)
    summaries = [run.summary() for run in runs]
    print()
    print(format_table(summaries))
    print()
    print(format_details(summaries))
    for run in runs:
        for problem in (run.store_failures + run.errors)[:5]:
            print(f"  ! {run.mode}/{run.server}: {problem}")
    path = write_results(
        "locomo-reconstruct",
        {
            "benchmark": "locomo-reconstruct",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data": str(args.data),
            "conversations": [c.name for c in conversations],
            "recall_limit": RECALL_LIMIT,
            "runs": summaries,
            "per_question": {f"{r.mode}/{r.server}": r.questions for r in runs} if args.per_question else None,
        },
    )
    print(f"\nresults written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, servers="ours, ours-pg, ref", default_modes="none")
    parser.add_argument("--data", default=DEFAULT_DATA_DIR, type=lambda p: __import__("pathlib").Path(p))
    parser.add_argument("--conversations", default="", help="comma list of file stems to keep (default: all)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
