"""The PostgreSQL trigram arms' exact shortcuts give the full statement's rows and scores.

(spec §5.7.1: the trigram arms' ranking; search_postgres_levels.) A real
PostgreSQL database per module (skips without CPERSONA_TEST_PG_URL; CI's
cluster has pgvector, so the rows carry its column as in production). Every
query is answered twice, with the shortcuts and with them switched off
(``full``), and the lists must be the same rows with the same scores in the
same order; each test also checks that the shortcut it is about did run, or
that its check sent the query on to the full statement.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import event, insert

from cpersona.storage import search_postgres, search_postgres_levels, search_sqlite
from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import upgrade
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_postgres_levels import Level, floor_worth_trying, lookup_costs, lower, pieces, plan
from cpersona.storage.search_words_postgres import PostgresWordSearch
from pg_support import fresh_pg_url


def _texts() -> list[tuple[str, str]]:
    """(agent, content) in id order: the groups each test below reads, interleaved with filler."""
    rows: list[tuple[str, str]] = []
    # Agent b's rows come first: the walk reads ids from the lowest, in every scope.
    rows += [("b", f"thanks from agent b {i}") for i in range(30)]
    # "thanks" inside a longer word: it matches, but below a row holding the word.
    rows += [("a", f"thanksgiving dinner plans {i}") for i in range(20)]
    for i in range(1500):
        rows.append(("a", f"the weather today is mild {i}"))
        if i % 2 == 0:
            rows.append(("a", f"a long report on nothing {i}"))
        else:
            rows.append(("a", f"plain filler line {i}"))
        if i % 40 == 0:
            rows.append(("a", f"thanks for the lift {i}"))  # 38 rows holding the word
        if i % 100 == 0:
            rows.append(("a", f"filler line {i}"))
    rows += [("a", f"quokka weather report together {i}") for i in range(15)]  # 3 of 4 terms
    rows += [("a", f"zeppelin weather seen {i}") for i in range(12)]  # 2 of 4
    rows += [("a", f"weather report joint {i}") for i in range(30)]  # 2 of 4, both common
    rows += [("a", f"a quokka sighting {i}") for i in range(20)]  # 1 of 4
    rows += [("a", f"a zeppelin sighting {i}") for i in range(20)]
    rows += [("a", f"dormouse {i} alone") for i in range(6)]
    rows += [("a", f"dormouse weather {i}") for i in range(3)]
    rows += [("a", f"dormous weather {i}") for i in range(12)]  # one term short, word_similarity 0.83
    return rows


@pytest.fixture(scope="module")
def pg():
    with fresh_pg_url() as url:
        db = open_postgres(url)
        upgrade(db)
        rng = np.random.default_rng(5)
        values = [
            {
                "agent_id": agent,
                "content": content,
                "timestamp": "2026-01-01",
                "created_at": f"2026-01-01 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}",
                "embedding": rng.standard_normal(8).astype("<f4").tobytes(),
            }
            for i, (agent, content) in enumerate(_texts())
        ]
        with db.write_connection() as conn:
            conn.execute(insert(Memory), values)
            conn.exec_driver_sql("ANALYZE memories")  # what autovacuum does after a fill
        yield db
        db.close()


@pytest.fixture
def over_budget(monkeypatch):
    # The table (~3,200 rows) over the keyword budget, so the planner's estimates are read (as at
    # 100k), but not its four terms together (~2,400 rows): the budget leaves every term in.
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 3000)


def _answer(db, query: str, depth: int, *, full: bool = False, scope: str = "a") -> tuple[list, list[str]]:
    """((id, score) of keyword_memories, best first; the trigram statements sent, in order)."""
    sent: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        if "LIMIT %(examined)s" in statement:
            sent.append("walk")
        elif statement.startswith("WITH f AS"):
            # The candidate predicate: which terms it tests, and how (OR / AND).
            head = statement.split("OFFSET 0")[0]
            sent.append(f"tiered:{head.count('ILIKE')}:{'and' if ') AND (' in head else 'or'}")

    real_plan, real_examined = search_postgres_levels.plan, search_postgres.WALK_EXAMINED
    real_floors = search_postgres_levels.SIMILARITY_FLOORS
    if full:
        search_postgres_levels.plan = lambda *args, **kwargs: None
        search_postgres.WALK_EXAMINED = 0
        search_postgres_levels.SIMILARITY_FLOORS = ()
    event.listen(db.engine, "before_cursor_execute", before)
    try:
        hits = PostgresWordSearch(db).keyword_memories(Scope(scope), query, depth).hits
    finally:
        event.remove(db.engine, "before_cursor_execute", before)
        search_postgres_levels.plan, search_postgres.WALK_EXAMINED = real_plan, real_examined
        search_postgres_levels.SIMILARITY_FLOORS = real_floors
    return [(h.record.id, h.raw) for h in hits], sent


def _same_as_full(db, query: str, depth: int, **kwargs) -> list[str]:
    got, sent = _answer(db, query, depth, **kwargs)
    expected, _ = _answer(db, query, depth, full=True, **kwargs)
    assert got == expected
    assert len(got) == min(depth, len(got)) and got
    return sent


# -- the walk: one term ---------------------------------------------------------------


def test_one_term_walks_ids_from_the_lowest_to_the_rows_holding_the_word(pg):
    sent = _same_as_full(pg, "thanks", 10)
    assert sent == ["walk"]  # 10 rows at the top score within the walk: no full statement
    ids, _ = _answer(pg, "thanks", 10)
    got = [i for i, _ in ids]
    assert got == sorted(got)  # ties (score 2.0) in id order, lowest first, as the full statement orders them


def test_the_walk_keeps_to_the_scope_although_it_reads_every_scope(pg):
    # Agent b's 30 "thanks" rows hold the lowest ids: read by the walk, never returned for agent a.
    sent = _same_as_full(pg, "thanks", 20)
    assert sent == ["walk"]
    assert _same_as_full(pg, "thanks", 10, scope="b") == ["walk"]


def test_too_few_top_rows_in_the_walk_go_on_to_the_full_statement(pg, monkeypatch):
    # 38 rows of agent a hold the word: asking for 50 finds too few at the top score.
    sent = _same_as_full(pg, "thanks", 50)
    assert sent == ["walk", "tiered:1:or"]
    # A walk too short to reach 10 of them: the same.
    monkeypatch.setattr(search_postgres, "WALK_EXAMINED", 100)
    assert _same_as_full(pg, "thanks", 10) == ["walk", "tiered:1:or"]


def test_a_phrase_or_a_term_no_row_holds_as_a_word_is_answered_by_the_full_statement(pg):
    # "sighting" rows hold it as a word but only 40; "thanksg" is never a whole word (similarity < 1).
    assert _same_as_full(pg, "thanksg", 10) == ["walk", "tiered:1:or"]


def test_one_content_term_among_function_words_does_not_walk(pg):
    # "with", "them" rank last but are terms of the query: no row matches it as one word, so a
    # walk could never find the top score; the full statement answers at once.
    assert _same_as_full(pg, "thanks with them", 10) == ["tiered:1:or"]


# -- levels: several terms ------------------------------------------------------------


def test_two_terms_try_the_rows_holding_both_first(pg):
    # 15 + 12 + 30 + 3 rows hold both "weather" and a second term: "weather report" has 45.
    assert _same_as_full(pg, "weather report", 10) == ["tiered:2:and"]
    # 3 rows hold both: too few for 10, so the full statement ranks them with the rest.
    assert _same_as_full(pg, "dormouse weather", 10) == ["tiered:2:and", "tiered:2:or"]


def test_two_terms_few_holding_both_take_the_rows_above_a_similarity_floor_first(pg, over_budget, monkeypatch):
    # weather's ~1,570 rows over the (lowered) gate: 3 rows hold both terms, 12 "dormous weather"
    # rows reach similarity 0.7, so the first floor fills 10 and the full statement never runs.
    monkeypatch.setattr(search_postgres_levels, "FLOOR_MIN_ROWS", 1000)
    assert _same_as_full(pg, "dormouse weather", 10) == ["tiered:2:and", "tiered:4:and"]
    # 20 rows: both floors find 15, too few, so the full statement ranks the rest of weather's rows.
    sent = _same_as_full(pg, "dormouse weather", 20)
    assert sent == ["tiered:2:and", "tiered:4:and", "tiered:4:and", "tiered:2:or"]
    # Estimated under the gate (the default 2,000 rows): no floor is tried.
    monkeypatch.setattr(search_postgres_levels, "FLOOR_MIN_ROWS", 2000)
    assert _same_as_full(pg, "dormouse weather", 10) == ["tiered:2:and", "tiered:2:or"]


def test_a_floor_is_tried_only_where_the_terms_can_make_up_its_share_of_the_question():
    counts = {"gina's": 3000, "store": 3000}
    assert floor_worth_trying(["make", "parks"], {"make": 7000, "parks": 5}, "make parks")
    assert not floor_worth_trying(["make", "parks"], {"make": 700, "parks": 5}, "make parks")
    assert not floor_worth_trying(["gina's", "store"], counts, "How is Gina's store doing?")
    assert not floor_worth_trying(["make", "parks"], {}, "make parks")  # under the budget: no estimates


def _narrow(sent: list[str]) -> list[bool]:
    """For each trigram statement: did its candidates test fewer terms than the query's four?"""
    return [int(kind.split(":")[1]) < 4 for kind in sent]


def test_common_terms_are_left_out_when_the_cut_shows_they_cannot_reach_it(pg, over_budget):
    # weather (~1,560 rows) and report (~800) stand out against quokka (35) and zeppelin (32):
    # the candidates leave them out; 15 rows hold three terms and 12 more two, so the cut (3) is
    # reached among the rare terms' rows and the full statement never runs. (Which rare term the
    # planner's sample reads as the rarer decides the level tried first, not the answer.)
    sent = _same_as_full(pg, "quokka zeppelin weather report", 10)
    assert all(_narrow(sent)), sent


def test_a_cut_of_one_goes_on_to_the_full_statement(pg, over_budget):
    # 60 rows: only 57 hold two or more terms, so the cut is one term and every weather row competes.
    sent = _same_as_full(pg, "quokka zeppelin weather report", 60)
    assert _narrow(sent)[0] and not _narrow(sent)[-1]


@pytest.mark.parametrize(
    ("first", "depth", "expected"),
    [
        # Level 3 from the two rare terms: 15 rows hold three terms, the cut is 3.
        (Level(3, False, ("quokka", "zeppelin")), 10, ["tiered:2:or"]),
        # 25 rows: their cut is 2 (27 rows of two or more among them): exact at level 2, the
        # three rarest terms (report's rows join, for "weather report joint").
        (Level(3, False, ("quokka", "zeppelin")), 25, ["tiered:2:or", "tiered:3:or"]),
        # Level 4 from zeppelin alone: no row holds all four, its 12 rows of two name level 2.
        (Level(4, False, ("zeppelin",)), 10, ["tiered:1:or", "tiered:3:or"]),
    ],
)
def test_a_lower_cut_names_the_exact_level_to_retry_at(pg, over_budget, monkeypatch, first, depth, expected):
    monkeypatch.setattr(search_postgres_levels, "plan", lambda *args, **kwargs: first)
    assert _same_as_full(pg, "quokka zeppelin weather report", depth) == expected


def test_under_the_budget_no_estimates_so_no_level_for_three_terms(pg):
    assert _same_as_full(pg, "quokka zeppelin weather report", 10) == ["tiered:4:or"]


# -- the plan itself (no database) -----------------------------------------------------


def test_the_plan_leaves_out_the_terms_far_commoner_than_the_rarest():
    counts = {"quokka": 10, "zeppelin": 10, "weather": 1010, "report": 2020}
    assert plan(["quokka", "zeppelin", "weather", "report"], counts, 10) == Level(3, False, ("quokka", "zeppelin"))
    assert plan(["a1", "b1", "c1"], {"a1": 10, "b1": 20, "c1": 30}, 10) is None  # none stands out
    assert plan(["a1", "b1", "c1"], {}, 10) is None  # no estimates
    assert plan(["a1", "b1"], {}, 10) == Level(2, True)
    assert plan(["a1"], {"a1": 5}, 10) is None
    # Every term but the rarest stands out: its rows alone, level 3.
    assert plan(["a1", "b1", "c1"], {"a1": 10, "b1": 500, "c1": 900}, 10) == Level(3, False, ("a1",))
    assert lower(["a1", "b1", "c1"], {"a1": 10, "b1": 500, "c1": 900}, 2) == Level(2, False, ("a1", "b1"))


def test_a_punctuated_term_costs_what_its_lookup_reads():
    # The GIN lookup of "John's" reads every row holding "john": the plan prices it so.
    found = pieces(["John's", "weather", "CVE-2024-3094", "a-b"])
    assert found == {"John's": ["John"], "CVE-2024-3094": ["CVE", "2024", "3094"]}
    estimates = {"John's": 10, "John": 17000, "weather": 900, "CVE-2024-3094": 5, "CVE": 50, "2024": 3000}
    costs = lookup_costs(estimates, found)
    assert costs["John's"] == 17000 and costs["weather"] == 900
    assert costs["CVE-2024-3094"] == 50  # the rarest piece: the lookup needs all of them
    assert plan(["John's", "weather", "zeppelin"], {**costs, "zeppelin": 10}, 10) == Level(3, False, ("zeppelin",))
