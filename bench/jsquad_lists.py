"""Dump recall's ranked lists for a JSQuAD sample, so fusions can be compared offline (as bench/fusion_lists.py).

In-process (the library, not MCP): every paragraph stored as bench/jsquad.py
stores it, then for each question of the sample the retrievers' lists
(channel, weight, rows with rank and raw score, paragraph id) are written
beside the gold paragraph and the answer recall actually gave.

    python bench/jsquad_lists.py --embedding local --questions 300 --out /tmp/jsquad-lists.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from jsquad import AGENT, DEFAULT_DATA, RECALL_LIMIT, load  # noqa: E402
from mcp_driver import LOCAL_MODEL, REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.config import load_settings  # noqa: E402
from cpersona.embedding.client import build_embedder  # noqa: E402
from cpersona.services.app import App  # noqa: E402
from cpersona.services.recall.retrievers import exclusion, retrieve, search_backend  # noqa: E402
from cpersona.services.recall.service import depth_for, parse_request, run_recall  # noqa: E402
from cpersona.services.records.memories import store  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.migrate import upgrade  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedding", choices=("none", "local"), default="local")
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    paragraphs, questions = load(args.data, args.questions)
    workdir = Path(tempfile.mkdtemp(prefix="cpersona-jsquad-lists-"))
    db = open_sqlite(workdir / "cpersona.db")
    upgrade(db)
    env = {
        "CPERSONA_DB_PATH": str(workdir / "cpersona.db"),
        "CPERSONA_UPDATE_CHECK": "false",
        "CPERSONA_DEGRADED_ADVISORY": "false",
    }
    if args.embedding == "local":
        env.update({"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(LOCAL_MODEL)})
    app = App(db=db, settings=load_settings(env))
    app.embedder = build_embedder(app.settings)
    started = time.perf_counter()
    for paragraph in paragraphs:
        store(app, agent_id=AGENT, content=paragraph.content, id=paragraph.id)
    print(f"  stored {len(paragraphs)} paragraphs ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    backend = search_backend(app)
    out = []
    for question in questions:
        req = parse_request(app, {"agent_id": AGENT, "query": question.text, "limit": RECALL_LIMIT})
        with app.db.snapshot():
            found = retrieve(app, backend, req.retriever_query(), depth_for(app, req), exclusion(()))
            answer = run_recall(app, req)
        label = {key: record.msg_id for key, record in found.records.items()}
        out.append(
            {
                "conversation": question.part,
                "question": question.text,
                "evidence": [question.paragraph],
                "lists": [
                    {
                        "channel": lst.channel,
                        "weight": lst.weight,
                        "rows": [[f"{e.key[0]}:{e.key[1]}", label[e.key], e.rank, e.raw] for e in lst.entries],
                    }
                    for lst in found.lists
                ],
                "answer": [m.get("id") for m in reversed(answer.messages)],
            }
        )
    args.out.write_text(
        json.dumps({"embedding": args.embedding, "settings": env, "questions": out}, ensure_ascii=False)
    )
    print(f"{len(out)} questions written to {args.out} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
