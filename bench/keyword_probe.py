"""Keyword-only LoCoMo in-process, one database per conversation kept between runs, for quick variants.

Stores every turn as bench/locomo.py does (no embedder), then recalls every
question through ``run_recall`` (the whole recall path: word merge, fusion,
gate) and scores it. In-process, so a variant costs about half a minute. Writes a file
bench/locomo_folds.py reads (one candidate per ``--label``).

    python bench/keyword_probe.py --label today --out /tmp/probe-today.json
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from metrics import average, score_question  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.config import load_settings  # noqa: E402
from cpersona.services.app import App  # noqa: E402
from cpersona.services.recall.service import parse_request, run_recall  # noqa: E402
from cpersona.services.records.memories import store  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.migrate import upgrade  # noqa: E402

LIMIT = 10


def app_for(path: Path, env: dict[str, str]) -> App:
    db = open_sqlite(path)
    upgrade(db)
    return App(db=db, settings=load_settings({**env, "CPERSONA_DB_PATH": str(path)}))


def run(data: Path, settings: list[str]) -> list[dict]:
    env = {
        "CPERSONA_UPDATE_CHECK": "false",
        "CPERSONA_DEGRADED_ADVISORY": "false",
        **dict(s.split("=", 1) for s in settings),
    }
    conversations = load_conversations(data)
    # One database, each conversation stored just before its questions, as bench/locomo.py's
    # one server does: bm25's document frequencies are the whole index's at that moment.
    workdir = Path(tempfile.mkdtemp(prefix="cpersona-keyword-probe-"))
    app = app_for(workdir / "locomo.db", env)
    out = []
    for conversation in conversations:
        for turn in conversation.turns:
            store(app, agent_id=conversation.agent_id, content=turn.content, id=turn.dia_id, timestamp=turn.timestamp)
        for q in conversation.questions:
            req = parse_request(app, {"agent_id": conversation.agent_id, "query": q.question, "limit": LIMIT})
            answer = run_recall(app, req)
            ranked = []
            for m in reversed(answer.messages):
                if m.get("id") and m["id"] not in ranked:
                    ranked.append(m["id"])
            out.append(
                {
                    "conversation": conversation.name,
                    "question": q.question,
                    "category": q.category,
                    "evidence": list(q.evidence),
                    "ranked": ranked,
                    "scores": score_question(ranked, q.evidence),
                }
            )
    app.db.engine.dispose()
    shutil.rmtree(workdir, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--setting", action="append", default=[], metavar="CPERSONA_X=VALUE")
    parser.add_argument("--label", default="ours")
    parser.add_argument(
        "--patch",
        action="append",
        default=[],
        metavar="MODULE:NAME=PYTHON",
        help="set a module constant first, e.g. cpersona.services.recall.replies:AHEAD=False",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for patch in args.patch:
        target, value = patch.split("=", 1)
        module, name = target.split(":")
        setattr(importlib.import_module(module), name, ast.literal_eval(value))
    started = time.process_time()
    questions = run(args.data, args.setting)
    by_conv: dict[str, list] = {}
    for q in questions:
        by_conv.setdefault(q["conversation"], []).append(q["scores"])
    for name, rows in [*sorted(by_conv.items()), ("all", [q["scores"] for q in questions])]:
        f = average(rows)
        print(f"{args.label:<24} {name:>4} R@10 {f['recall@10']:.3f} NDCG@10 {f['ndcg@10']:.3f} MRR {f['mrr']:.3f}")
    print(f"  cpu {time.process_time() - started:.1f} s", file=sys.stderr)
    args.out.write_text(json.dumps({"per_question": {f"none/{args.label}": questions}}))


if __name__ == "__main__":
    main()
