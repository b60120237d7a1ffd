"""Where MiniLM's missing LoCoMo evidence could come from: candidate sources measured offline (issue 14, seventh pass).

Input: a ``bench/fusion_lists.py --raw-depth N`` dump (recall's lists per
question and each keyword index's own list, N deep). Every turn and question
of the dev conversations is embedded once with the in-process
all-MiniLM-L6-v2 (the ONNX export recall's ``local`` mode loads; cached in
bench/.cache/), so the vector channel can be varied beyond what the dump
holds: every turn's cosine is known, not just the near list's.

Printed, per conversation:

1. ``--check``: the replay of recall's rrf chain (``fusion.vector_votes``,
   ``on_one_scale``, ``defer_to_clear_first``, ``seat_vector_only``, rrf at
   K = 60; gate aside) against the dumped answer.
2. Gains and losses of MiniLM against keyword-only, question by question:
   their sum is today's margin, the gains alone are the margin an answer that
   never lost a keyword row would have (the ceiling of any seat rule).
3. Candidate sources: for each way of proposing rows the answer does not
   hold (the near list read deeper, rows both channels rank deeper, the
   session neighbours of the answer's rows, the reply of a near-list row
   that asks), the R@10 it would add if every proposed row got a free seat,
   rows proposed per question, and its precision (evidence share per row,
   each question's evidence weighted 1/|evidence| as R@10 weighs it) beside
   the precision of the answer's own seats 1-10: a source whose precision is
   not above the seats it would take cannot raise R@10.
4. ``--variants``: near lists built another way (a turn's cosine plus
   ``alpha`` × the best cosine of its session neighbours, the question
   embedded on its content words too), alone and through recall's chain
   with 1-3 or every vector-only seat, leave one conversation out.

    python bench/fusion_lists.py --embedding local --raw-depth 100 --out raw.json
    python bench/candidate_replay.py --lists raw.json --check --variants
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

import numpy as np  # noqa: E402

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from metrics import average, score_question  # noqa: E402
from mcp_driver import LOCAL_MODEL, REPO_DIR  # noqa: E402
from pair_replay import lists_of  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import VECTOR_CHANNELS, Ranked, RankedList, rrf  # noqa: E402
from cpersona.services.recall.replies import asks  # noqa: E402
from cpersona.services.records.nodes import BOUNDARY_CLASSES  # noqa: E402
from cpersona.storage.search import FUNCTION_WORDS  # noqa: E402
from cpersona.storage.search_words import SHORT_FUNCTION_WORDS  # noqa: E402

LIMIT = 10
RRF_K = 60
CACHE = Path(__file__).resolve().parent / ".cache" / "candidate-replay-minilm-v4.npz"
SENTENCE_END = next(p for p in BOUNDARY_CLASSES if p.pattern.startswith("[。"))  # the sentence class
_WORD = re.compile(r"\w+(?:'\w+)?")
_LABEL = re.compile(r"[^:\n]{1,40}: ")  # a chat turn's speaker, as LoCoMo turns are stored


def content_words(question: str) -> str:
    """The question without function words (the word channel's list), or the question when nothing is left."""
    kept = [w for w in _WORD.findall(question) if w.lower() not in FUNCTION_WORDS | SHORT_FUNCTION_WORDS]
    return " ".join(kept) or question


def nameless(question: str, speakers: set[str]) -> str:
    """The question without the conversation's speaker names (a possessive 's too), or the question when nothing is left."""
    kept = [w for w in _WORD.findall(question) if re.sub(r"'s$", "", w).lower() not in speakers]
    return " ".join(kept) or question


def turn_of(dia_id: str) -> tuple[int, int]:
    """'D3:12' -> (3, 12): session and turn."""
    session, turn = dia_id[1:].split(":")
    return int(session), int(turn)


def neighbours(ids: list[str]) -> list[list[int]]:
    """For each turn, the indexes of the turns just before and after it in the same session."""
    out = []
    for j, dia in enumerate(ids):
        session = turn_of(dia)[0]
        out.append([k for k in (j - 1, j + 1) if 0 <= k < len(ids) and turn_of(ids[k])[0] == session])
    return out


def smoothed(cosines: np.ndarray, near: list[list[int]], alpha: float) -> np.ndarray:
    """Each turn's cosine plus ``alpha`` × the best cosine of its session neighbours."""
    if alpha == 0:
        return cosines
    best = np.array([max((cosines[k] for k in ks), default=0.0) for ks in near], dtype=cosines.dtype)
    return cosines + alpha * best


def sentences(text: str) -> list[str]:
    """``text`` cut after each sentence end (record nodes' OV-9 sentence class); pieces without a word dropped."""
    pieces, start = [], 0
    for match in SENTENCE_END.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if _WORD.search(p)]


def labelled(text: str) -> list[str]:
    """:func:`sentences` of ``text``, each after the first under the text's leading label ("Jon: ...") when it has one."""
    pieces = sentences(text)
    label = _LABEL.match(text)
    if label is None:
        return pieces
    return pieces[:1] + [label.group(0) + piece for piece in pieces[1:]]


def passage_vectors(turns: np.ndarray, pieces: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """One vector per turn: its own vector plus the mean of its sentences' vectors, renormalised.

    A turn of one sentence keeps its own vector (the mean is that vector again, near enough).
    """
    total = np.zeros_like(turns)
    np.add.at(total, owner, pieces)
    counts = np.bincount(owner, minlength=len(turns))
    mean = total / np.maximum(np.linalg.norm(total, axis=1, keepdims=True), 1e-12)
    both = turns + mean
    out = both / np.linalg.norm(both, axis=1, keepdims=True)
    return np.where((counts > 1)[:, None], out, turns).astype(turns.dtype)


def embeddings(cache: Path) -> dict[str, dict[str, Any]]:
    """Per conversation: turn ids and vectors, sentence vectors and their turn, question vectors
    (as asked, ``Q``, and on content words only, ``W``)."""
    conversations = load_conversations(DEFAULT_DATA_DIR)
    names = ("T", "Q", "W", "N", "M", "S", "L", "owner")
    if cache.exists():
        stored = np.load(cache, allow_pickle=False)
        return {
            c.name: {
                "ids": [t.dia_id for t in c.turns], "questions": [q.question for q in c.questions],
                **{k: stored[f"{c.name}/{k}"] for k in names},
            }
            for c in conversations
        }  # fmt: skip
    from cpersona.config import load_settings
    from cpersona.embedding.local import build_provider

    settings = load_settings({"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(LOCAL_MODEL)})
    model = build_provider(settings).get()

    def embed(texts: list[str], query: bool) -> np.ndarray:
        return np.vstack([model.embed(texts[i : i + 32], query=query) for i in range(0, len(texts), 32)])

    out, arrays = {}, {}
    for c in conversations:
        questions = [q.question for q in c.questions]
        speakers = {t.speaker.lower() for t in c.turns}
        split = [(j, piece) for j, t in enumerate(c.turns) for piece in sentences(t.content)]
        item = {
            "ids": [t.dia_id for t in c.turns], "questions": questions,
            "T": embed([t.content for t in c.turns], False), "Q": embed(questions, True),
            "W": embed([content_words(q) for q in questions], True),
            "N": embed([nameless(q, speakers) for q in questions], True),
            "M": embed([nameless(content_words(q), speakers) for q in questions], True),
            "S": embed([piece for _, piece in split], False), "owner": np.array([j for j, _ in split]),
            "L": embed([piece for t in c.turns for piece in labelled(t.content)], False),
        }  # fmt: skip
        out[c.name] = item
        arrays.update({f"{c.name}/{k}": item[k] for k in names})
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **arrays)
    return out


def chain(q: dict[str, Any], near: list[tuple[tuple[str, int], str, float]] | None = None, seats: int = 2) -> list[str]:
    """Recall's rrf chain on the dumped lists, the near list replaced by ``near`` (key, dia_id, score) when given."""
    lists, label = lists_of(q)
    if near is not None:
        for key, dia, _ in near:
            label[key] = dia
        entries = tuple(Ranked(key, rank, raw) for rank, (key, _, raw) in enumerate(near))
        lists = [RankedList("vector", entries) if lst.channel == "vector" else lst for lst in lists]
        lists = list(fusion.confirmed(lists, LIMIT))
    counts = q.get("counts") or []
    lists = list(fusion.vector_votes(lists, LIMIT))
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    lists = list(fusion.defer_to_clear_first(lists))
    if seats:
        lists = list(fusion.seat_vector_only(lists, seats, RRF_K))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def keyword_only(q: dict[str, Any]) -> list[str]:
    lists, label = lists_of(q)
    lists = [lst for lst in fusion.within_cut(lists, LIMIT) if lst.channel not in VECTOR_CHANNELS]
    counts = q.get("counts") or []
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def recall_share(answer: list[str], evidence: set[str]) -> float:
    return len(evidence & set(answer)) / len(evidence)


def sources(q: dict[str, Any], answer: list[str], vrank: dict[str, int], text: dict[str, str]) -> dict[str, set[str]]:
    """Rows each candidate source proposes for one question (before removing the answer's own rows)."""
    by_cosine = sorted(vrank, key=vrank.get)
    keyword_rank: dict[str, int] = {}
    for name in ("mem_trigram", "mem_word"):
        for rank, row in enumerate(q["raw"][name]):
            keyword_rank[row[1]] = min(keyword_rank.get(row[1], rank), rank)

    def beside(dia: str, offsets: tuple[int, ...]) -> list[str]:
        session, turn = turn_of(dia)
        return [f"D{session}:{turn + o}" for o in offsets]

    top = [d for d in answer if d != "ep"]
    out: dict[str, set[str]] = {}
    for k in (15, 20, 30):
        out[f"near list to {k}"] = set(by_cosine[:k])
    for v, w in ((20, 20), (30, 30), (50, 20), (50, 50)):
        out[f"near <{v} and keyword <{w}"] = {d for d in by_cosine[:v] if keyword_rank.get(d, 999) < w}
    for k, m in ((3, 20), (5, 20), (10, 50)):
        out[f"+-2 of answer top {k}, near <{m}"] = {
            x for d in top[:k] for x in beside(d, (-2, -1, 1, 2)) if vrank.get(x, 999) < m
        }
    for k in (1, 2, 5):
        out[f"next turn of answer top {k}"] = {x for d in top[:k] for x in beside(d, (1,))}
    for k in (10, 20):
        out[f"reply of a near <{k} row that asks"] = {beside(d, (1,))[0] for d in by_cosine[:k] if asks(text[d])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True, help="a fusion_lists.py dump made with --raw-depth")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--variants", action="store_true")
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    if "raw" not in questions[0]:
        parser.error("the dump needs --raw-depth (each keyword index's own list)")
    vectors = embeddings(args.cache)
    texts = {(c.name, t.dia_id): t.content for c in load_conversations(DEFAULT_DATA_DIR) for t in c.turns}
    convs = sorted({q["conversation"] for q in questions})
    keys: dict[tuple[str, str], tuple[str, int]] = {}
    offset = 0
    for c in sorted(vectors, key=int):  # turns are stored conversation by conversation, ids from 1
        for j, dia in enumerate(vectors[c]["ids"]):
            keys[(c, dia)] = ("mem", offset + j + 1)
        offset += len(vectors[c]["ids"])
    seen: dict[str, int] = defaultdict(int)
    for q in questions:
        c = q["conversation"]
        q["_index"] = seen[c]
        seen[c] += 1
        if vectors[c]["questions"][q["_index"]] != q["question"]:
            raise SystemExit("the dump's questions are not in the data's order")
        cosines = vectors[c]["T"] @ vectors[c]["Q"][q["_index"]]
        q["_vrank"] = {vectors[c]["ids"][j]: r for r, j in enumerate(np.argsort(-cosines, kind="stable"))}
        q["_answer"], q["_keyword"] = chain(q), keyword_only(q)
    count = {c: sum(q["conversation"] == c for q in questions) for c in convs}
    count["all"] = len(questions)
    if args.check:
        same = sum(q["_answer"] == q["answer"][:LIMIT] for q in questions)
        print(f"replay equals the dumped answer on {same} of {len(questions)} questions")

    print("MiniLM minus keyword-only, R@10: gains (questions) / losses (questions) / margin")
    for c in convs:
        diffs = [
            recall_share(q["_answer"], set(q["evidence"])) - recall_share(q["_keyword"], set(q["evidence"]))
            for q in questions if q["conversation"] == c
        ]  # fmt: skip
        gain, loss = sum(d for d in diffs if d > 0), sum(d for d in diffs if d < 0)
        print(
            f"  {c}: +{gain / count[c]:.3f} ({sum(d > 0 for d in diffs)}) / {loss / count[c]:.3f}"
            f" ({sum(d < 0 for d in diffs)}) / {(gain + loss) / count[c]:+.3f}"
        )

    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for q in questions:
        c, evidence = q["conversation"], set(q["evidence"])
        weight = 1 / len(evidence)
        text = {d: texts[(c, d)] for d in vectors[c]["ids"]}
        for name, rows in sources(q, q["_answer"], q["_vrank"], text).items():
            rows = {d for d in rows if d in q["_vrank"] and d not in q["_answer"]}
            for group in (c, "all"):
                found[name][group][0] += weight * len(rows & evidence)
                found[name][group][1] += len(rows)
        for seat, dia in enumerate(q["_answer"]):
            for group in (c, "all"):
                found[f"answer seat {seat + 1}"][group][0] += weight * (dia in evidence)
                found[f"answer seat {seat + 1}"][group][1] += 1
    print("candidate source: R@10 added if every row got a free seat / rows per question / precision %")
    for name, cells in found.items():
        print(
            f"  {name:<36} "
            + " ".join(
                f"{g}:{cells[g][0] / count[g]:.3f}/{cells[g][1] / count[g]:.1f}/{100 * cells[g][0] / max(cells[g][1], 1):.1f}"
                for g in [*convs, "all"]
            )
        )
    confidence(questions, vectors, convs)
    if args.variants:
        variants(questions, vectors, keys, convs)


def confidence(questions, vectors, convs) -> None:
    """Precision of the near list's first two vector-only rows by how peaked the near list is (a per-query confidence).

    Margin = the near list's first cosine minus its tenth, split in thirds over
    all questions; only questions where the vector lists vote (not set aside
    by ``fusion.vector_votes``). A confidence worth acting on would show a
    clearly higher precision in the top third than in the bottom one.
    """
    rows = []
    for q in questions:
        lists, label = lists_of(q)
        lists = list(fusion.vector_votes(lists, LIMIT))
        near = next((lst for lst in lists if lst.channel == "vector" and lst.weight > 0), None)
        if near is None:
            continue
        lexical = {e.key for lst in lists if lst.channel not in VECTOR_CHANNELS for e in lst.entries}
        only = [label[e.key] for e in near.entries if e.key not in lexical][:2]
        v = vectors[q["conversation"]]
        top = np.sort(v["T"] @ v["Q"][q["_index"]])[::-1]
        rows.append((float(top[0] - top[LIMIT - 1]), q["conversation"], only, set(q["evidence"])))
    cuts = np.quantile([r[0] for r in rows], [1 / 3, 2 / 3])
    tally: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
    for margin, c, only, evidence in rows:
        third = int(np.searchsorted(cuts, margin))
        for group in (c, "all"):
            for dia in only:
                tally[(group, third)][0] += (dia in evidence) / len(evidence)
                tally[(group, third)][1] += 1
    print(f"first two vector-only rows by near-list margin (thirds, cut at {cuts[0]:.3f} / {cuts[1]:.3f}): precision %")
    for group in [*convs, "all"]:
        print(
            f"  {group:>4} "
            + " ".join(
                f"{('low', 'mid', 'high')[t]} {100 * tally[(group, t)][0] / max(tally[(group, t)][1], 1):.1f}"
                f" ({tally[(group, t)][1]})"
                for t in range(3)
            )
        )


def variants(questions, vectors, keys, convs) -> None:
    near_of = {c: neighbours(vectors[c]["ids"]) for c in vectors}
    passages = {
        (c, kind): passage_vectors(v["T"], v[kind], v["owner"]) for c, v in vectors.items() for kind in ("S", "L")
    }
    runs: dict[tuple, dict[str, list]] = {}
    print("near list variants: alone R@10 | through recall's chain R@10/NDCG@10 by vector-only seats (0 = every row)")
    print("  passage: turn = the stored text's vector (today); sentences = turn + mean of its sentences (one vector);")
    print("  labelled = the same, each sentence under the turn's speaker label; best labelled = max(turn, best")
    print("  labelled sentence); query: asked, both = asked + content words; alpha: session context")
    kinds = ("turn", "sentences", "labelled", "best labelled")
    queries = ("asked", "both", "nameless", "asked+nameless", "nameless words")
    for passage, query, alpha in itertools.product(kinds, queries, (0.0, 0.15)):
        alone: dict[str, list] = defaultdict(list)
        nears = {}
        for q in questions:
            c, v = q["conversation"], vectors[q["conversation"]]
            asked, words = v["Q"][q["_index"]], v["W"][q["_index"]]
            vec = {
                "asked": asked, "both": asked + words, "nameless": v["N"][q["_index"]],
                "asked+nameless": asked + v["N"][q["_index"]], "nameless words": v["M"][q["_index"]],
            }[query]  # fmt: skip
            vec = vec / np.linalg.norm(vec)
            if passage == "best labelled":
                cosines = v["T"] @ vec
                np.maximum.at(cosines, v["owner"], v["L"] @ vec)
            elif passage == "turn":
                cosines = v["T"] @ vec
            else:
                cosines = passages[(c, "S" if passage == "sentences" else "L")] @ vec
            score = smoothed(cosines, near_of[c], alpha)
            order = np.argsort(-score, kind="stable")[: fusion.past_the_cut(LIMIT)]
            nears[id(q)] = [(keys[(c, v["ids"][j])], v["ids"][j], float(score[j])) for j in order]
            alone[c].append(score_question([d for _, d, _ in nears[id(q)]][:LIMIT], q["evidence"]))
        print(
            f"  {passage:<13} {query:<5} alpha {alpha:<4}  alone "
            + " ".join(f"{average(alone[c])['recall@10']:.3f}" for c in convs)
        )
        for seats in (1, 2, 3, 0):
            fused: dict[str, list] = defaultdict(list)
            for q in questions:
                fused[q["conversation"]].append(score_question(chain(q, nears[id(q)], seats), q["evidence"]))
            runs[(passage, query, alpha, seats)] = fused
            print(
                f"      seats {seats}  "
                + " ".join(f"{average(fused[c])['recall@10']:.3f}/{average(fused[c])['ndcg@10']:.3f}" for c in convs)
            )

    families = {
        "seats only (today's near list)": lambda r: r[:3] == ("turn", "asked", 0.0),
        "one stored vector per row (turn, sentences, labelled; asked; no context)": lambda r: (
            r[1:3] == ("asked", 0.0) and r[0] != "best labelled"
        ),
        "labelled rows, query as asked or without speaker names": lambda r: (
            r[0] == "labelled" and r[2] == 0.0 and r[1] in ("asked", "nameless", "asked+nameless", "nameless words")
        ),
        "every variant": lambda r: True,
    }
    for family, member in families.items():
        leave_one_out(questions, runs, convs, [r for r in runs if member(r)], family)


def leave_one_out(questions, runs, convs, members, family) -> None:
    """Choose a member on four conversations (R@10 + NDCG@10), score the fifth; every fold printed."""

    def objective(rows: list) -> float:
        f = average(rows)
        return f["recall@10"] + f["ndcg@10"]

    print(f"leave one conversation out, {family} ({len(members)} members):")
    pooled, pooled_kw = [], []
    for held in convs:
        chosen = max(members, key=lambda r: objective([s for c in convs if c != held for s in runs[r][c]]))  # noqa: B023
        rows = runs[chosen][held]
        kw = [score_question(q["_keyword"], q["evidence"]) for q in questions if q["conversation"] == held]
        pooled += rows
        pooled_kw += kw
        f, k = average(rows), average(kw)
        print(
            f"  held {held}: chose {chosen}  {f['recall@10']:.3f}/{f['ndcg@10']:.3f}"
            f"  keyword-only {k['recall@10']:.3f}/{k['ndcg@10']:.3f}"
            f"  margin R@10 {f['recall@10'] - k['recall@10']:+.3f} NDCG@10 {f['ndcg@10'] - k['ndcg@10']:+.3f}"
        )
    f, k = average(pooled), average(pooled_kw)
    print(
        f"  pooled held-out {f['recall@10']:.3f}/{f['ndcg@10']:.3f}  keyword-only {k['recall@10']:.3f}/{k['ndcg@10']:.3f}"
    )


if __name__ == "__main__":
    main()
