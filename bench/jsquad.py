"""JSQuAD paragraph retrieval over MCP: Japanese questions against Wikipedia paragraphs.

Data: the JSQuAD validation split of JGLUE v1.3 as prepared in
``shared/data/jsquad-dev/`` (CC BY-SA 4.0, attribution in its README; nothing of
it is copied into this repository). Per server and embedding mode: a fresh
database; every paragraph stored as one memory ``"<title>\\n<text>"`` under one
agent, ``id`` = the paragraph id; each question of a fixed sample recalled with
``limit 10``; scored on whether the question's paragraph comes back (R@1, R@5,
R@10, MRR@10; the last recalled row is the best, spec RC-1). A plain
character-bigram BM25 over the same paragraphs is printed as the baseline.

The sample (1,000 questions, ``random.Random(7).sample``) is split by article
title into a **tuning** half and a **held** half (SHA-1 of the title, first
byte even = tuning): the Japanese query reading was tuned on the first only,
and both are printed, with the whole sample.

    python bench/jsquad.py --servers ours,ref
    python bench/jsquad.py --servers ours --questions 200      # quick
    python bench/jsquad.py --servers ours,ours-pg               # SQLite and PostgreSQL
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from bm25 import BM25Index  # noqa: E402
from mcp_driver import REPO_DIR, embedding_env, start_server, write_results  # noqa: E402
from metrics import percentile  # noqa: E402
from run_matrix import add_run_arguments, run_all  # noqa: E402

# shared/ sits beside the main checkout, or two levels above a worktree
DEFAULT_DATA = next(
    (
        path
        for base in (REPO_DIR.parent, REPO_DIR.parent.parent)
        if (path := base / "shared" / "data" / "jsquad-dev" / "jsquad-v1.3-valid.json").exists()
    ),
    REPO_DIR.parent / "shared" / "data" / "jsquad-dev" / "jsquad-v1.3-valid.json",
)
RECALL_LIMIT = 10
AGENT = "jsquad"
SAMPLE_SEED = 7
METRICS = ("r@1", "r@5", "r@10", "mrr@10")
PARTS = ("tuning", "held", "all")


@dataclass(frozen=True)
class Paragraph:
    id: str
    title: str
    content: str


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    paragraph: str
    part: str  # "tuning" or "held"


def part_of(title: str) -> str:
    return "tuning" if hashlib.sha1(title.encode("utf-8")).digest()[0] % 2 == 0 else "held"


def load(path: Path, sample: int) -> tuple[list[Paragraph], list[Question]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    paragraphs = [Paragraph(p["id"], p["title"], f"{p['title']}\n{p['text']}") for p in data["paragraphs"]]
    titles = {p.id: p.title for p in paragraphs}
    chosen = data["questions"]
    if sample and sample < len(chosen):
        chosen = random.Random(SAMPLE_SEED).sample(chosen, sample)
    return paragraphs, [
        Question(q["id"], q["question"], q["paragraph"], part_of(titles[q["paragraph"]])) for q in chosen
    ]


def score(ranked: list[str], gold: str) -> dict[str, float]:
    rank = ranked.index(gold) + 1 if gold in ranked[:RECALL_LIMIT] else 0
    return {
        "r@1": float(rank == 1),
        "r@5": float(0 < rank <= 5),
        "r@10": float(rank > 0),
        "mrr@10": 1.0 / rank if rank else 0.0,
    }


def summarise(questions: list[Question], scores: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for part in PARTS:
        kept = [s for q, s in zip(questions, scores) if part == "all" or q.part == part]
        means = {m: (sum(s[m] for s in kept) / len(kept) if kept else 0.0) for m in METRICS}
        out[part] = {"questions": len(kept), **means}
    return out


def char_bigrams(text: str) -> list[str]:
    """The baseline's tokens: lower-cased, whitespace removed, every adjacent pair."""
    chars = re.sub(r"\s+", "", text.lower())
    return [chars[i : i + 2] for i in range(len(chars) - 1)]


def bigram_baseline(paragraphs: list[Paragraph], questions: list[Question]) -> dict[str, Any]:
    index = BM25Index([p.id for p in paragraphs], [p.content for p in paragraphs], tokenizer=char_bigrams)
    scores = [score(index.search(q.text, RECALL_LIMIT), q.paragraph) for q in questions]
    return summarise(questions, scores)


@dataclass
class RunResult:
    server: str
    mode: str
    server_version: str = ""
    stored: int = 0
    problems: list[str] = field(default_factory=list)
    recall_ms: list[float] = field(default_factory=list)
    ranked: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    aborted: str = ""


async def run_server(
    run: RunResult, embed_url: str | None, paragraphs: list[Paragraph], questions: list[Question]
) -> None:
    started = time.perf_counter()
    by_content = {p.content: p.id for p in paragraphs}
    async with start_server(run.server, embedding_env(run.mode, embed_url)) as server:
        run.server_version = str(server.server_info.get("version", ""))
        by_ref: dict[str, str] = {}
        for paragraph in paragraphs:
            answer, _ = await server.try_call(
                "store", {"agent_id": AGENT, "content": paragraph.content, "id": paragraph.id}
            )
            if answer.get("ok") is True and answer.get("result") == "stored":
                by_ref[f"mem:{answer['id']}"] = paragraph.id
                run.stored += 1
            else:
                run.problems.append(f"store {paragraph.id}: {json.dumps(answer, ensure_ascii=False)[:200]}")
        print(f"  [{run.mode}/{run.server}] stored {run.stored} paragraphs", file=sys.stderr, flush=True)
        scores = []
        for question in questions:
            answer, elapsed = await server.try_call(
                "recall", {"agent_id": AGENT, "query": question.text, "limit": RECALL_LIMIT}
            )
            run.recall_ms.append(elapsed)
            if "messages" not in answer or answer.get("ok") is False:
                run.problems.append(f"recall {question.id}: {json.dumps(answer, ensure_ascii=False)[:200]}")
            ranked = ranked_ids(answer.get("messages") or [], by_ref, by_content)
            run.ranked[question.id] = ranked
            scores.append(score(ranked, question.paragraph))
    run.figures = summarise(questions, scores)
    run.seconds = time.perf_counter() - started


def ranked_ids(messages: list[dict[str, Any]], by_ref: dict[str, str], by_content: dict[str, str]) -> list[str]:
    """Best-first paragraph ids of a recall answer (rows come worst first)."""
    ranked: list[str] = []
    for message in reversed(messages):
        found = by_ref.get(str(message.get("ref", ""))) or (message.get("id") if message.get("id") else None)
        found = found or by_content.get(str(message.get("content", "")))
        if found and found not in ranked:
            ranked.append(str(found))
    return ranked


def format_table(rows: list[tuple[str, str, dict[str, Any], float | None]]) -> str:
    header = (
        f"{'mode':<6} {'server':<18} "
        + " ".join(f"{p + ' ' + m:>15}" for p in PARTS for m in ("r@1", "mrr@10"))
        + f" {'all r@5':>8} {'all r@10':>9} {'p50 ms':>7}"
    )
    lines = [header, "-" * len(header)]
    for mode, server, figures, p50 in rows:
        cells = " ".join(f"{figures[p][m]:>15.3f}" for p in PARTS for m in ("r@1", "mrr@10"))
        tail = f" {figures['all']['r@5']:>8.3f} {figures['all']['r@10']:>9.3f} " + (
            f"{p50:>7.1f}" if p50 is not None else f"{'-':>7}"
        )
        lines.append(f"{mode:<6} {server:<18} {cells}{tail}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    paragraphs, questions = load(args.data, args.questions)
    counts = {part: sum(q.part == part for q in questions) for part in ("tuning", "held")}
    print(
        f"JSQuAD: {len(paragraphs)} paragraphs, {len(questions)} questions "
        f"({counts['tuning']} tuning, {counts['held']} held), limit {RECALL_LIMIT}",
        flush=True,
    )

    async def run_one(run: RunResult, embed_url: str | None) -> None:
        await run_server(run, embed_url, paragraphs, questions)

    runs = await run_all(args, lambda name, mode: RunResult(server=name, mode=mode), run_one)
    baseline = bigram_baseline(paragraphs, questions)
    rows = [(r.mode, r.server, r.figures, percentile(r.recall_ms, 0.5)) for r in runs if r.figures]
    rows.append(("-", "bigram BM25", baseline, None))
    print()
    print(format_table(rows))
    for run in runs:
        for problem in run.problems[:5]:
            print(f"  ! {run.mode}/{run.server}: {problem}")
        if run.problems:
            print(f"  ! {run.mode}/{run.server}: {len(run.problems)} problems in all")
    path = write_results(
        "jsquad",
        {
            "benchmark": "jsquad",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data": str(args.data),
            "paragraphs": len(paragraphs),
            "questions": len(questions),
            "recall_limit": RECALL_LIMIT,
            "runs": [
                {
                    "server": r.server,
                    "mode": r.mode,
                    "server_version": r.server_version,
                    "stored": r.stored,
                    "figures": r.figures,
                    "problems": len(r.problems),
                    "recall_p50_ms": percentile(r.recall_ms, 0.5),
                    "recall_p95_ms": percentile(r.recall_ms, 0.95),
                    "seconds": round(r.seconds, 1),
                    "aborted": r.aborted or None,
                }
                for r in runs
            ],
            "bigram_bm25": baseline,
            "per_question": {f"{r.mode}/{r.server}": r.ranked for r in runs} if args.per_question else None,
        },
    )
    print(f"\nresults written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, servers="ours, ours-pg, ref", default_modes="none")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the prepared jsquad-v1.3-valid.json")
    parser.add_argument("--questions", type=int, default=1000, help="sample size (0 = every question)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
