"""Confidence scoring and what hangs off it (spec §5.9.2–5.9.6, GATE-5, §5.11, §5.12, §6 item 2).

Formulas are checked against the spec's worked numbers; the pipeline is run on
a real SQLite file with the real local embedding server (tests/embed_server.py)
answering the query vector, and stored vectors written from the same
deterministic embedder, so every cosine below is the one recall computes.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from sqlalchemy import insert, select

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.vectors import to_blob
from cpersona.services.app import App
from cpersona.services.recall.confidence import (
    TimeSpan,
    memory_time_span,
    row_confidence,
    stored_cosines,
)
from cpersona.services.recall.gate import Candidate, CalibratedGate, apply_gate, autocut
from cpersona.services.recall.prior import apply_prior, prior_applies
from cpersona.services.recall.service import recall
from cpersona.services.recall.with_context import recall_with_context
from cpersona.storage.models import Episode, Memory, Profile
from cpersona.storage.scope import Scope
from cpersona.storage.search import Record, open_search
from conftest import db_settings_env
from embed_server import embed_text

pytestmark = pytest.mark.both_backends  # service behaviour: run on SQLite and PostgreSQL

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
DEFAULTS = load_settings({"CPERSONA_DB_PATH": "unused.db"})
SOURCE = '{"type": "Agent", "id": "b", "name": ""}'

# A row that names the query word but whose vector points elsewhere: the FTS
# arm finds it, the vector arm does not (cosine ≈ −0.10 with "xylophone").
LEXICAL_ONLY = (
    "The quarterly finance report covered budgets forecasts revenue margins staffing costs travel policies "
    "procurement audits compliance deadlines vendor contracts leasing depreciation amortisation treasury hedging "
    "payroll benefits pensions insurance litigation reserves inventory logistics warehousing shipping tariffs "
    "customs and xylophone."
)
# Found by both arms with a middling cosine (≈ 0.33): confidence ≈ 0.48 when fresh.
MIDDLING = "the xylophone lessons happen on tuesday evenings downtown"


def iso(moment: datetime) -> str:
    return moment.isoformat()


def cosine(a: str, b: str) -> float:
    """The float32 dot product recall computes between two texts' stored vectors."""
    va = np.asarray(embed_text(a), dtype=np.float32)
    vb = np.asarray(embed_text(b), dtype=np.float32)
    return float(np.dot(va, vb))


# -- the formula (spec §5.9.3) -----------------------------------------------------------


def test_worked_example_episode_written_now():  # spec §5.9.3 worked example
    scored = row_confidence(DEFAULTS, now=NOW, span=TimeSpan(), cosine=0.7087, stamp=iso(NOW))
    assert scored.score == 0.9617
    assert scored.payload == {"age_hours": 0.0, "cosine": 0.7087, "score": 0.9617}


def test_worked_example_profile_of_unknown_age():  # spec §5.9.3 worked example
    newest = NOW - timedelta(hours=1794)
    span = TimeSpan(oldest=newest - timedelta(hours=360), newest=newest)
    scored = row_confidence(DEFAULTS, now=NOW, span=span, cosine=None, stamp=None)
    # age 1794 + 360/2 = 1974 h; rate 0.005/(360/168) ≈ 0.00233; 1/(1+4.6) < 0.3 → decay 0.3
    assert scored.payload == {"age_hours": 1974.0, "age_unknown": True, "score": 0.5477}


def test_unknown_age_without_any_dated_memory_is_half_a_day():  # spec §5.9.3 age rule
    scored = row_confidence(DEFAULTS, now=NOW, span=TimeSpan(), cosine=None, stamp="not a time")
    assert scored.payload["age_hours"] == 12.0 and scored.payload["age_unknown"] is True
    assert scored.score == round(math.sqrt(1 / (1 + 12 * 0.005)), 4)


def test_cosine_is_stretched_between_floor_and_ceiling():  # spec §5.9.3 norm
    fresh = {"now": NOW, "span": TimeSpan(), "stamp": iso(NOW)}
    assert row_confidence(DEFAULTS, cosine=0.20, **fresh).score == 0.0
    assert row_confidence(DEFAULTS, cosine=-0.3, **fresh).score == 0.0
    assert row_confidence(DEFAULTS, cosine=0.75, **fresh).score == 1.0
    assert row_confidence(DEFAULTS, cosine=0.95, **fresh).score == 1.0
    assert row_confidence(DEFAULTS, cosine=0.475, **fresh).score == round(math.sqrt(0.5), 4)


def test_long_spans_slow_the_decay():  # spec §5.9.3 rate scaling
    stamp = iso(NOW - timedelta(hours=100))
    short = TimeSpan(NOW - timedelta(hours=100), NOW)  # range ≤ 168 h: nominal rate
    long = TimeSpan(NOW - timedelta(hours=1680), NOW)  # 10 × 168 h: a tenth of the rate
    assert row_confidence(DEFAULTS, now=NOW, span=short, cosine=None, stamp=stamp).score == round(
        math.sqrt(1 / (1 + 100 * 0.005)), 4
    )
    assert row_confidence(DEFAULTS, now=NOW, span=long, cosine=None, stamp=stamp).score == round(
        math.sqrt(1 / (1 + 100 * 0.0005)), 4
    )


def test_recalls_raise_the_floor_and_the_boost_fades():  # spec §5.9.3 boost / floor
    ancient = iso(NOW - timedelta(hours=100_000))  # decay is at its floor
    base = {"now": NOW, "span": TimeSpan(), "cosine": None, "stamp": ancient}
    assert row_confidence(DEFAULTS, **base).score == round(math.sqrt(0.3), 4)
    # ln(1+n) × 0.02 = 0.1 → floor 0.4 (last recall long enough ago for no penalty, short enough to count)
    n = round(math.exp(5) - 1)
    boosted = row_confidence(DEFAULTS, **base, recall_count=n)
    assert boosted.score == round(math.sqrt(0.3 + math.log1p(n) * 0.02), 4)
    # the ceiling: a huge count lifts the floor to 0.5, no further
    assert row_confidence(DEFAULTS, **base, recall_count=10**9).score == round(math.sqrt(0.5), 4)
    # 500 h after the last recall the boost is halved: 1/(1 + 500 × 0.002)
    faded = row_confidence(
        DEFAULTS, **base, recall_count=n, last_recalled_at=(NOW - timedelta(hours=500)).strftime("%Y-%m-%d %H:%M:%S")
    )
    assert faded.score == round(math.sqrt(0.3 + math.log1p(n) * 0.02 / 2), 4)


def test_recent_recall_and_resolved_factors_and_deep():  # spec §5.9.3, RC-10
    fresh = {"now": NOW, "span": TimeSpan(), "cosine": 0.75, "stamp": iso(NOW)}
    four_min = (NOW - timedelta(minutes=4)).strftime("%Y-%m-%d %H:%M:%S")
    six_min = (NOW - timedelta(minutes=6)).strftime("%Y-%m-%d %H:%M:%S")
    assert row_confidence(DEFAULTS, **fresh, recall_count=1, last_recalled_at=four_min).score == 0.7
    assert row_confidence(DEFAULTS, **fresh, recall_count=1, last_recalled_at=six_min).score == 1.0
    assert row_confidence(DEFAULTS, **fresh, recall_count=1, last_recalled_at=four_min, deep=True).score == 1.0
    resolved = row_confidence(DEFAULTS, **fresh, resolved=True)
    assert resolved.score == 0.3 and resolved.payload["resolved"] is True
    # deep: no completion factor and no time decay, but the payload still says resolved
    old = {**fresh, "stamp": iso(NOW - timedelta(hours=5000))}
    deep = row_confidence(DEFAULTS, **old, resolved=True, deep=True)
    assert deep.score == 1.0 and deep.payload == {"age_hours": 5000.0, "resolved": True, "cosine": 0.75, "score": 1.0}


# -- span and stored vectors (spec §5.9.2, §5.9.4) -----------------------------------------


def add_memory(
    db, content: str, *, agent: str = "a", timestamp: str = "", embedding: Any = "auto", **extra: Any
) -> int:
    """A memory row; ``embedding="auto"`` stores the test embedder's vector of ``content``."""
    if embedding == "auto":
        embedding = embed_text(content)
    values = {"agent_id": agent, "content": content, "timestamp": timestamp, "source": SOURCE, **extra}
    if isinstance(embedding, list):
        values["embedding"] = to_blob(embedding)
    elif embedding is not None:
        values["embedding"] = embedding
    with db.write() as session:
        return session.execute(insert(Memory).values(**values)).inserted_primary_key[0]


def test_span_is_chronological_not_textual(db):  # spec §5.9.2
    add_memory(db, "a", timestamp="2026-01-01T10:00:00+09:00")  # 01:00 UTC: sorts last as text, is oldest
    add_memory(db, "b", timestamp="2026-01-01T02:00:00+00:00")  # the newest instant
    add_memory(db, "c", timestamp="garbage")  # unreadable: no part in the span
    add_memory(db, "d", timestamp="")
    add_memory(db, "f", timestamp="2500000")  # SQLite would read a Julian day (year 2132); not a date here
    add_memory(db, "e", timestamp="2030-01-01T00:00:00+00:00", agent="other")  # out of scope
    span = memory_time_span(open_search(db), Scope("a"))
    assert span.oldest == datetime(2026, 1, 1, 1, tzinfo=timezone.utc)
    assert span.newest == datetime(2026, 1, 1, 2, tzinfo=timezone.utc)
    assert span.range_hours == 1.0
    assert memory_time_span(open_search(db), Scope("nobody")) == TimeSpan()


def test_stored_cosines_only_for_usable_vectors(db):  # spec §5.9.4
    query = to_blob(embed_text("xylophone"))
    good = add_memory(db, "xylophone practice")
    narrow = add_memory(db, "xylophone 1", embedding=[1.0, 0.0, 0.0])  # another model's width
    nan = add_memory(db, "xylophone 2", embedding=np.full(64, np.nan, dtype="<f4").tobytes())  # never finite
    bare = add_memory(db, "xylophone 3", embedding=None)
    with db.write() as session:
        ep = session.execute(
            insert(Episode).values(
                agent_id="a", summary="xylophone night", embedding=to_blob(embed_text("xylophone night"))
            )
        ).inserted_primary_key[0]
    keys = [("mem", good), ("mem", narrow), ("mem", nan), ("mem", bare), ("ep", ep), ("profile", -1)]
    with db.read() as session:
        found = stored_cosines(session, query, keys)
        assert stored_cosines(session, None, keys) == {}  # no query vector, nothing to compare
    assert found == {
        ("mem", good): pytest.approx(cosine("xylophone", "xylophone practice"), abs=1e-6),
        ("ep", ep): pytest.approx(cosine("xylophone", "xylophone night"), abs=1e-6),
    }


# -- the gate and autocut on confidence (GATE-5, §5.12) -----------------------------------


def record(i: int, stamp: str = "") -> Record:
    return Record(kind="mem", id=i, text=f"row {i}", source="{}", timestamp=stamp)


def test_gate_judges_confidence_before_any_other_score():  # spec GATE-5
    # pool 7 → min_score 0.3996; the cosine alone would pass, the confidence does not
    low = Candidate(("mem", 1), record(1), cosine=0.9, rrf=0.03, confidence=0.39)
    high = Candidate(("mem", 2), record(2), cosine=0.1, rrf=0.001, confidence=0.41)
    assert apply_gate([low, high], pool=7, query_blank=False, deep=False, rrf_k=60) == [high]
    # a calibrated gate is used only when it was measured on confidence
    assert apply_gate(
        [low, high], pool=7, query_blank=False, deep=False, rrf_k=60, calibrated=CalibratedGate(0.35, "confidence")
    ) == [low, high]
    assert apply_gate(
        [low, high], pool=7, query_blank=False, deep=False, rrf_k=60, calibrated=CalibratedGate(0.05, "cosine")
    ) == [high]


def test_gate_takes_legacy_confidence_as_computed_after_the_penalty():  # spec GATE-5, §5.9 order
    penalised = Candidate(("mem", 1), record(1), confidence=0.35)
    penalised.penalty = 0.5  # confidence already saw the penalised cosine: no second correction
    assert apply_gate([penalised], pool=7, query_blank=False, deep=False, rrf_k=60) == []


def test_autocut_keys_on_confidence_even_on_fused_rows():  # spec §5.12 step 3
    rows = [
        Candidate(("mem", i), record(i), rrf=0.03 - i * 0.001, confidence=c)
        for i, c in enumerate([0.9, 0.85, 0.4, 0.38])
    ]
    assert autocut(rows, min_results=3, min_gap_ratio=0.15) == rows[:2]
    for row in rows:
        row.confidence = None
    assert autocut(rows, min_results=3, min_gap_ratio=0.15) == rows  # fusion scores are never cut


# -- the age prior (spec §5.9.6) ------------------------------------------------------------


def test_prior_reorders_fused_rows_by_age_and_keeps_every_row():  # spec §5.9.6
    settings = load_settings({"CPERSONA_DB_PATH": "x.db", "CPERSONA_PRIOR_AGE_RATE": "0.01"})
    old = Candidate(("mem", 1), record(1, "2026-11-20T00:00:00+00:00"), rrf=0.0328)
    new = Candidate(("mem", 2), record(2, "2026-11-30T00:00:00+00:00"), rrf=0.0320)
    undated = Candidate(("mem", 3), record(3, ""), rrf=0.0300)
    profile = Candidate(("profile", -1), profile_text="p")
    rows = [old, new, undated, profile]
    span = TimeSpan(datetime(2026, 11, 20, tzinfo=timezone.utc), datetime(2026, 11, 30, tzinfo=timezone.utc))
    assert prior_applies(DEFAULTS, rows, legacy=False) is None  # rate 0: identity
    assert prior_applies(settings, rows, legacy=True) is None  # legacy ordering: confidence orders
    assert prior_applies(settings, [old, Candidate(("mem", 4), record(4), cosine=0.5)], legacy=False) is None
    name = prior_applies(settings, rows, legacy=False)
    assert name == "rrf"
    out = apply_prior(settings, rows, name, span=span, now=NOW)
    assert out == [new, undated, old, profile]  # by rrf × p (0.0320, 0.0136, 0.0098); profile last
    assert new.prior == 1.0  # the newest memory is the anchor
    assert old.prior == 0.3  # 240 h × 0.01 → 1/3.4, floored
    assert undated.prior == pytest.approx(1 / (1 + 120 * 0.01))  # mid-span: 120 h from the newest
    assert profile.prior is None


# -- the pipeline ---------------------------------------------------------------------------


def vec_app(db, server, **env: str) -> App:
    environ = {
        **db_settings_env(db),
        "CPERSONA_EMBEDDING_MODE": "http",
        "CPERSONA_EMBEDDING_URL": server.url,
        "CPERSONA_CONFIDENCE_ENABLED": "true",
        "CPERSONA_EPISODE_PENALTY_ENABLED": "false",
        **{f"CPERSONA_{k}": v for k, v in env.items()},
    }
    settings = load_settings(environ)
    app = App(db=db, settings=settings, embedder=build_embedder(settings))
    app.clock = lambda: NOW
    return app


@pytest.fixture
def apps(db, embed_server):
    made: list[App] = []

    def make(**env: str) -> App:
        app = vec_app(db, embed_server, **env)
        made.append(app)
        return app

    yield make
    for app in made:
        app.embedder.close()


def counters(db) -> dict[int, tuple[int, str | None]]:
    with db.read() as session:
        rows = session.execute(select(Memory.id, Memory.recall_count, Memory.last_recalled_at))
        return {r.id: (r.recall_count, r.last_recalled_at) for r in rows}


def by_ref(response: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m.get("ref", "profile"): m for m in response["messages"]}


def fallback_corpus(db) -> tuple[int, int]:
    middling = add_memory(db, MIDDLING, timestamp=iso(NOW))
    lexical = add_memory(db, LEXICAL_ONLY, timestamp="2026-11-28T00:00:00+00:00")
    return middling, lexical


def test_repeated_recall_under_legacy_falls_back_to_the_lexical_row(db, apps):  # spec §5.11 reference example
    middling, lexical = fallback_corpus(db)
    app = apps(CONFIDENCE_ORDERING="legacy")
    stamp = NOW.strftime("%Y-%m-%d %H:%M:%S")

    first = recall(app, agent_id="a", query="xylophone")
    # pool 2 → min_score 0.447; fresh MIDDLING: sqrt((0.3287 − 0.2)/0.55) ≈ 0.4837 passes; the backfilled
    # lexical row (cosine ≈ −0.10 → confidence 0) does not
    assert [m["ref"] for m in first["messages"]] == [f"mem:{middling}"]
    assert "gate_fallback" not in first  # spec RC-4: absent, never false
    assert first["messages"][0]["match_reason"]["signal"] == "confidence"
    assert counters(db) == {middling: (1, stamp), lexical: (0, None)}  # spec §5.9.5

    app.clock = lambda: NOW + timedelta(minutes=2)  # within the 5-minute window: × 0.7 → 0.3386 < 0.447
    second = recall(app, agent_id="a", query="xylophone")
    assert second["gate_fallback"] is True
    (rescued,) = second["messages"]
    assert rescued["ref"] == f"mem:{lexical}"
    expected = cosine("xylophone", LEXICAL_ONLY)
    assert rescued["match_reason"]["signal"] == "confidence"
    assert rescued["match_reason"]["cosine"] == pytest.approx(expected, abs=1e-6)  # the backfilled cosine
    assert rescued["confidence"] == {"age_hours": 60.0, "cosine": round(expected, 4), "score": 0.0}
    assert counters(db) == {middling: (1, stamp), lexical: (0, None)}  # a rescue credits nobody (§5.11)

    # recall_with_context forwards the flag (RWC-8)
    assert recall_with_context(app, agent_id="a", query="xylophone")["gate_fallback"] is True

    app.clock = lambda: NOW + timedelta(minutes=6)  # the penalty is over
    third = recall(app, agent_id="a", query="xylophone")
    assert "gate_fallback" not in third and [m["ref"] for m in third["messages"]] == [f"mem:{middling}"]


def test_fusion_ordering_never_falls_back_and_shows_a_stored_cosine(db, apps):  # spec §5.9.3, §5.11
    for i in range(40):  # a pool of 42: a lexical row ranked first by its arm passes the rrf bar
        add_memory(db, f"filler number {i} about gardening", timestamp="2026-11-01T00:00:00+00:00")
    direct = add_memory(db, "xylophone lessons on tuesday", timestamp="2026-11-29T00:00:00+00:00")
    lexical = add_memory(db, LEXICAL_ONLY, timestamp="2026-11-28T00:00:00+00:00")
    app = apps()  # fusion ordering is the default
    response = recall(app, agent_id="a", query="xylophone")
    assert "gate_fallback" not in response
    rows = by_ref(response)
    shown = rows[f"mem:{lexical}"]
    expected = cosine("xylophone", LEXICAL_ONLY)
    # the displayed cosine rides in match_reason but the row is still judged on rrf
    assert shown["match_reason"]["signal"] == "rrf"
    assert shown["match_reason"]["cosine"] == pytest.approx(expected, abs=1e-6)
    assert shown["confidence"]["cosine"] == round(expected, 4) and shown["confidence"]["score"] == 0.0
    native = rows[f"mem:{direct}"]
    assert native["match_reason"]["signal"] == "cosine"
    assert native["confidence"]["cosine"] == round(native["match_reason"]["cosine"], 4)
    # span 2026-11-01 .. 2026-11-29 (672 h): rate 0.005/4, age 36 h
    assert native["confidence"]["age_hours"] == 36.0
    # confidence neither orders nor gates: the same answer as with confidence off
    plain = recall(apps(CONFIDENCE_ENABLED="false"), agent_id="a", query="xylophone")
    assert [m["ref"] for m in plain["messages"]] == [m["ref"] for m in response["messages"]]
    assert all("confidence" not in m for m in plain["messages"])
    assert all("cosine" not in m["match_reason"] for m in plain["messages"] if m["ref"] == f"mem:{lexical}")


def test_legacy_orders_every_row_by_confidence_profile_included(db, apps):  # spec §5.9.3 legacy, ORD-3
    for i in range(50):  # pool ≥ 50: the profile may pass the gate
        add_memory(db, f"filler number {i} about gardening", timestamp="2026-11-01T00:00:00+00:00")
    strong = add_memory(db, "xylophone lessons on tuesday", timestamp="2026-11-29T00:00:00+00:00")
    with db.write() as session:
        session.execute(insert(Profile).values(agent_id="a", user_id="", content="plays the xylophone"))
    legacy = recall(apps(CONFIDENCE_ORDERING="legacy"), agent_id="a", query="xylophone")
    scores = [m["confidence"]["score"] for m in legacy["messages"]]
    assert scores == sorted(scores)  # worst → best by confidence (RC-1)
    assert all(
        m["match_reason"] == {**m["match_reason"], "signal": "confidence", "score": m["confidence"]["score"]}
        for m in legacy["messages"]
    )
    rows = by_ref(legacy)
    assert rows["profile"]["match_reason"] == {"signal": "confidence", "score": rows["profile"]["confidence"]["score"]}
    assert rows["profile"]["confidence"]["age_unknown"] is True
    assert legacy["messages"][-1]["ref"] == f"mem:{strong}"


def test_fusion_profile_shows_confidence_without_match_reason(db, apps):  # spec §5.14, RC-5
    for i in range(50):
        add_memory(db, f"filler number {i} about gardening", timestamp="2026-11-01T00:00:00+00:00")
    with db.write() as session:
        session.execute(insert(Profile).values(agent_id="a", user_id="", content="plays the xylophone"))
    response = recall(apps(), agent_id="a", query="")  # blank: recency listing, profile last (RC-3)
    profile = response["messages"][-1]
    assert profile["content"] == "[Profile] plays the xylophone"
    assert "match_reason" not in profile and profile["confidence"]["age_unknown"] is True
    assert all("confidence" in m and "match_reason" not in m for m in response["messages"])


def test_counters_skip_deep_and_paused_recalls_and_count_in_fusion(db, apps):  # spec §5.9.5, RC-10, RC-12, P-12
    strong = add_memory(db, "xylophone lessons on tuesday", timestamp=iso(NOW))
    other = add_memory(db, "gardening notes for the spring", timestamp=iso(NOW))
    app = apps()  # fusion ordering: the counters still count (observed on the reference)
    untouched = {strong: (0, None), other: (0, None)}
    assert [m["ref"] for m in recall(app, agent_id="a", query="xylophone", deep=True)["messages"]] == [f"mem:{strong}"]
    assert counters(db) == untouched  # deep never counts
    app.writes_paused = True
    assert recall(app, agent_id="a", query="xylophone")["messages"]
    assert counters(db) == untouched  # a paused caller writes nothing, counters included
    app.writes_paused = False

    answer = recall(app, agent_id="a", query="xylophone")
    assert counters(db) == {strong: (1, NOW.strftime("%Y-%m-%d %H:%M:%S")), other: (0, None)}
    fresh = row_confidence(
        DEFAULTS,
        now=NOW,
        span=TimeSpan(NOW, NOW),
        stamp=iso(NOW),
        cosine=answer["messages"][0]["match_reason"]["cosine"],
    )
    # the confidence shown was computed before this recall's own bump
    assert answer["messages"][0]["confidence"]["score"] == fresh.score
    app.clock = lambda: NOW + timedelta(minutes=1)
    again = recall(app, agent_id="a", query="xylophone")
    assert (
        again["messages"][0]["confidence"]["score"]
        == row_confidence(
            DEFAULTS,
            now=NOW + timedelta(minutes=1),
            span=TimeSpan(NOW, NOW),
            stamp=iso(NOW),
            cosine=answer["messages"][0]["match_reason"]["cosine"],
            recall_count=1,
            last_recalled_at=NOW.strftime("%Y-%m-%d %H:%M:%S"),
        ).score
    )
    assert again["messages"][0]["confidence"]["score"] < fresh.score


def test_prior_in_the_pipeline_reorders_and_shows_in_match_reason(db, apps):  # spec §5.9.6, §5.14
    old = add_memory(db, "xylophone practice", timestamp="2026-11-01T00:00:00+00:00")
    new = add_memory(db, "xylophone lessons on tuesday", timestamp="2026-11-29T00:00:00+00:00")
    plain = recall(apps(CONFIDENCE_ENABLED="false"), agent_id="a", query="xylophone")
    assert all("prior" not in m["match_reason"] for m in plain["messages"])  # rate 0: identity
    leaning = recall(apps(CONFIDENCE_ENABLED="false", PRIOR_AGE_RATE="0.01"), agent_id="a", query="xylophone")
    assert sorted(m["ref"] for m in leaning["messages"]) == sorted(m["ref"] for m in plain["messages"])
    rows = by_ref(leaning)
    assert rows[f"mem:{new}"]["match_reason"]["prior"] == 1.0  # anchor: the newest memory
    assert rows[f"mem:{old}"]["match_reason"]["prior"] == 0.3  # 672 h old → 1/7.72, floored
    assert leaning["messages"][-1]["ref"] == f"mem:{new}"  # best last (RC-1)
    # legacy ordering: confidence orders, the prior stays out
    legacy = recall(apps(CONFIDENCE_ORDERING="legacy", PRIOR_AGE_RATE="0.01"), agent_id="a", query="xylophone")
    assert all("prior" not in m["match_reason"] for m in legacy["messages"])


def test_reconstruct_reports_the_rescue_under_legacy(db, apps):  # spec §5.11, RX-12, RX-13
    from cpersona.services.reconstruct.service import reconstruct

    middling, lexical = fallback_corpus(db)
    app = apps(CONFIDENCE_ORDERING="legacy")
    recall(app, agent_id="a", query="xylophone")  # counts MIDDLING: it is held back for 5 minutes
    app.clock = lambda: NOW + timedelta(minutes=2)
    out = reconstruct(app, agent_id="a", query="xylophone")
    assert out["gate_fallback"] is True
    assert out["shortfall_reason"] == "below_quality_threshold"
    assert counters(db)[lexical] == (0, None)  # reconstruct never counts (RX-9)


def test_gate_calibration_under_legacy_measures_confidence(db, apps):  # spec GATE-3, §5.18.3
    from cpersona.services.calibration.fused_gate import scored_candidates

    add_memory(db, "xylophone lessons on tuesday", timestamp=iso(NOW))
    add_memory(db, LEXICAL_ONLY, timestamp=iso(NOW))
    rows = scored_candidates(apps(CONFIDENCE_ORDERING="legacy"), "a", "xylophone")
    assert rows and all(row.signal[0] == "confidence" for row in rows)
    assert any(row.backfilled for row in rows)
    assert all(row.signal[0] != "confidence" for row in scored_candidates(apps(), "a", "xylophone"))


def test_legacy_confidence_orders_rrf_and_rsf_alike(db, apps):  # spec §5.9.3: "rrf and rsf return the same order"
    for i, text in enumerate(
        [
            "xylophone lessons on tuesday",
            "xylophone practice",
            MIDDLING,
            LEXICAL_ONLY,
            "the xylophone is in the hall cupboard",
            "tuesday dinner plans",
        ]
    ):
        add_memory(db, text, timestamp=f"2026-11-{20 + i:02d}T00:00:00+00:00")
    answers = {}
    for mode in ("rrf", "rsf"):
        # deep: no counters bumped, so the second recall sees what the first saw (RC-10)
        response = recall(
            apps(CONFIDENCE_ORDERING="legacy", RECALL_MODE=mode), agent_id="a", query="xylophone tuesday", deep=True
        )
        answers[mode] = [m["ref"] for m in response["messages"]]
    assert len(answers["rrf"]) >= 3
    assert answers["rrf"] == answers["rsf"]
    fused = {
        mode: [
            m["ref"]
            for m in recall(apps(RECALL_MODE=mode), agent_id="a", query="xylophone tuesday", deep=True)["messages"]
        ]
        for mode in ("rrf", "rsf")
    }
    assert fused["rrf"] != answers["rrf"] or fused["rsf"] != answers["rsf"]  # confidence did reorder something
