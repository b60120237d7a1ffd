"""Checks of bench/candidate_replay.py's own arithmetic (no model, no dump needed).

Run: .venv/bin/pytest bench/tests/test_candidate_replay.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR))

from candidate_replay import chain, content_words, keyword_only, neighbours, smoothed, sources, turn_of  # noqa: E402


def test_content_words_drop_the_question_words_and_keep_the_subject():
    assert content_words("When did Jon lose his job as a banker?") == "Jon lose job banker"
    assert content_words("What did you do?") == "What did you do?"  # nothing left: the question as asked


def test_neighbours_stay_inside_a_session():
    ids = ["D1:1", "D1:2", "D2:1", "D2:2", "D2:3"]
    assert neighbours(ids) == [[1], [0], [3], [2, 4], [3]]
    assert turn_of("D12:7") == (12, 7)


def test_a_turn_gains_alpha_times_its_best_neighbour():
    cosines = np.array([0.1, 0.5, 0.2, 0.9], dtype=np.float32)
    near = [[1], [0, 2], [1], []]  # the last turn is alone in its session
    got = smoothed(cosines, near, 0.5)
    assert np.allclose(got, [0.1 + 0.25, 0.5 + 0.1, 0.2 + 0.25, 0.9])
    assert smoothed(cosines, near, 0.0) is cosines


def _question() -> dict:
    # keyword list: rows 1, 2, 3 (dia D1:1..D1:3); near list: row 4 alone, then row 2
    return {
        "counts": [],
        "lists": [
            {"channel": "vector", "weight": 1.0, "rows": [["mem:4", "D1:4", 0, 0.9], ["mem:2", "D1:2", 1, 0.8]]},
            {
                "channel": "memories",
                "weight": 1.0,
                "rows": [["mem:1", "D1:1", 0, 3.0], ["mem:2", "D1:2", 1, 2.9], ["mem:3", "D1:3", 2, 2.8]],
            },
        ],
    }


def test_the_replayed_chain_fuses_both_channels_and_keyword_only_drops_the_vector_list():
    q = _question()
    # D1:2 is on both lists, so it outranks the keyword first place; the vector-only row ties rank 1 and loses the tie
    assert chain(q) == ["D1:2", "D1:1", "D1:4", "D1:3"]
    assert keyword_only(q) == ["D1:1", "D1:2", "D1:3"]
    # a replacement near list replaces the dumped one
    assert chain(q, near=[(("mem", 3), "D1:3", 0.7)]) == ["D1:3", "D1:1", "D1:2"]


def test_sources_propose_session_neighbours_and_replies_of_asking_rows():
    q = {"raw": {"mem_trigram": [["mem:1", "D1:1", 1.0]], "mem_word": []}}
    vrank = {"D1:1": 0, "D1:2": 1, "D1:3": 2, "D2:1": 3}
    text = {"D1:1": "Did you go?", "D1:2": "Yes.", "D1:3": "Then home.", "D2:1": "Hi"}
    got = sources(q, ["D1:2"], vrank, text)
    assert got["next turn of answer top 1"] == {"D1:3"}
    assert got["+-2 of answer top 3, near <20"] == {"D1:1", "D1:3"}  # D1:0 and D1:4 are no turns: no rank
    assert got["reply of a near <10 row that asks"] == {"D1:2"}
    assert got["near <20 and keyword <20"] == {"D1:1"}
