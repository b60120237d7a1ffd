"""Dump recall's ranked lists for every LoCoMo question, so fusions can be compared offline.

In-process (the library, not MCP): every turn is stored as bench/locomo.py
stores it (optionally one episode per session), then for every question the
retrievers' lists (channel, weight, rows with rank and raw score, dia_id or
"ep") are written beside the evidence and the answer recall actually gave.
A fusion tried on these lists sees exactly what recall's fusion saw; the gate
is not re-run, so a candidate chosen here is confirmed with bench/locomo.py.

    python bench/fusion_lists.py --embedding local --out /tmp/lists-local.json
    python bench/fusion_lists.py --embedding local --episodes per-session --out /tmp/lists-ep.json
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from mcp_driver import LOCAL_MODEL, REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.config import load_settings  # noqa: E402
from cpersona.embedding.client import build_embedder  # noqa: E402
from cpersona.services.app import App  # noqa: E402
from cpersona.services.recall.retrievers import (  # noqa: E402
    arm_threshold,
    embed_query,
    exclusion,
    nearest,
    retrieve,
    search_backend,
    second_text,
)
from cpersona.services.recall.service import depth_for, parse_request, run_recall  # noqa: E402
from cpersona.services.records.episodes import archive_episode  # noqa: E402
from cpersona.services.records.memories import store  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.migrate import upgrade  # noqa: E402

LIMIT = 10


def raw_lists(app: App, backend, req, depth: int) -> dict[str, list]:
    """Each retriever's own ranked list, unmerged: rows as [key, label, raw]."""
    query = req.retriever_query()
    out: dict[str, list] = {}
    with app.db.snapshot():
        # The query vector recall searches with: as asked, plus the query without the
        # scope's speaker names when one occurs in it (services/recall/nameless.py).
        second = second_text(app, backend, query) if app.embedder is not None else None
        vector = embed_query(app, query.text, measure=False, second=second) if app.embedder is not None else None
        if vector is not None:
            window = (0, app.settings.max_memories)
            out["vector"] = nearest(backend, query, vector, depth, arm_threshold(app, query.agent_id), window)
        out["ep_trigram"] = backend.keyword_episodes(query.scope, query.text, depth)
        out["ep_word"] = backend.word_episodes(query.scope, query.text, depth)
        out["mem_trigram"] = backend.keyword_memories(query.scope, query.text, depth).hits
        out["mem_word"] = backend.word_memories(query.scope, query.text, depth)
    return {
        name: [[f"{h.record.key[0]}:{h.record.key[1]}", h.record.msg_id if h.record.kind == "mem" else "ep", h.raw]
               for h in hits]
        for name, hits in out.items()
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedding", choices=("none", "local"), default="local")
    parser.add_argument("--episodes", choices=("none", "per-session"), default="none")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--setting", action="append", default=[], metavar="CPERSONA_X=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--raw-depth",
        type=int,
        default=0,
        help="also dump each retriever's own list (trigram and word per table, vector near) this deep",
    )
    parser.add_argument(
        "--patch",
        action="append",
        default=[],
        metavar="MODULE:NAME=PYTHON",
        help="set a module constant first, e.g. cpersona.services.recall.common_words:SHARE=0.1",
    )
    args = parser.parse_args()
    for patch in args.patch:
        target, value = patch.split("=", 1)
        module, name = target.split(":")
        setattr(importlib.import_module(module), name, ast.literal_eval(value))

    workdir = Path(tempfile.mkdtemp(prefix="cpersona-fusion-lists-"))
    db = open_sqlite(workdir / "cpersona.db")
    upgrade(db)
    env = {
        "CPERSONA_DB_PATH": str(workdir / "cpersona.db"),
        "CPERSONA_UPDATE_CHECK": "false",
        "CPERSONA_DEGRADED_ADVISORY": "false",
        **dict(item.split("=", 1) for item in args.setting),
    }
    if args.embedding == "local":
        env.update({"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(LOCAL_MODEL)})
    app = App(db=db, settings=load_settings(env))
    app.embedder = build_embedder(app.settings)
    started = time.perf_counter()
    questions = []
    for conversation in load_conversations(args.data):
        agent = conversation.agent_id
        ends = {s.last_dia_id: s for s in conversation.sessions} if args.episodes == "per-session" else {}
        for turn in conversation.turns:
            store(app, agent_id=agent, content=turn.content, id=turn.dia_id, timestamp=turn.timestamp)
            if (session := ends.get(turn.dia_id)) is not None and session.summary:
                archive_episode(
                    app,
                    agent_id=agent,
                    summary=session.summary,
                    history=[{"role": "user", "content": f"session {session.number}", "timestamp": session.timestamp}],
                )
        print(f"  stored {conversation.name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        backend = search_backend(app)
        for question in conversation.questions:
            req = parse_request(app, {"agent_id": agent, "query": question.question, "limit": LIMIT})
            with app.db.snapshot():
                found = retrieve(app, backend, req.retriever_query(), depth_for(app, req), exclusion(()))
                answer = run_recall(app, req)
            label = {key: (record.msg_id if record.kind == "mem" else "ep") for key, record in found.records.items()}
            questions.append(
                {
                    "conversation": conversation.name,
                    "question": question.question,
                    "category": question.category,
                    "evidence": list(question.evidence),
                    "lists": [
                        {
                            "channel": lst.channel,
                            "weight": lst.weight,
                            "rows": [[f"{e.key[0]}:{e.key[1]}", label[e.key], e.rank, e.raw] for e in lst.entries],
                        }
                        for lst in found.lists
                    ],
                    "cosines": {f"{k[0]}:{k[1]}": v for k, v in found.cosines.items()},
                    "counts": list(found.counts or ()),
                    **({"raw": raw_lists(app, backend, req, args.raw_depth)} if args.raw_depth else {}),
                    "answer": [m.get("id") or "ep" for m in reversed(answer.messages)],
                }
            )
    args.out.write_text(
        json.dumps({"embedding": args.embedding, "episodes": args.episodes, "settings": env, "questions": questions})
    )
    print(f"{len(questions)} questions written to {args.out} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
