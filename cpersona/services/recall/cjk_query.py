"""Keyword recall for queries in Japanese (and other kana/kanji text): content runs, bigrams, IDF.

The trigram arm alone serves such queries poorly. Japanese has no spaces, so
its every 3-character window is a term, and most windows straddle a particle
(``猫の名``, ``の名前``) that the stored text need not share; a content word of
one or two characters (``猫``, ``名前``, ``東京``) is no term at all. So
``猫の名前`` missed 「…猫を二匹飼っていて、名前はミケとタマです。」.

Here a query holding kana or kanji is read two ways:

- **content runs**: maximal runs of kanji, of katakana, or of Latin letters and
  digits; hiragana (particles, okurigana), punctuation, spaces and script
  changes end a run (``Pythonの設定`` → ``python``, ``設定``). The interrogative
  ``何``/``誰`` ends a run too, as English function words are left out of
  ranking (``何割`` → ``割``, ``憲法何条`` → ``憲法``, ``条``): the stored text
  holds the answer where the question holds ``何``, so the whole run is never in it.
- **bigrams**: every adjacent pair of the query's characters, spaces removed,
  except pairs inside a Latin word (that word is a run already). They keep
  what the runs drop: verb and adjective endings, numbers next to counters.

Candidates are the trigram arm's best rows, plus for each run the rows that
hold it: an FTS phrase search for runs of three or more characters, a
bounded newest-first substring probe for shorter ones. Each candidate is
scored BM25-style over the units it holds (a run counts as :data:`RUN_WEIGHT`
bigrams), with document frequencies counted over the scope's newest rows, so
a row sharing more and rarer runs wins. JSQuAD dev (docs/benchmarks.md): R@1
0.865 → 0.92.

Deterministic: no model, ties keep candidate order. Bounded: at most
:data:`MAX_PROBED_RUNS` probes, :data:`MAX_BIGRAMS` + :data:`MAX_RUNS` units,
one statistics statement over :data:`STATS_SAMPLE` rows.
"""

from __future__ import annotations

import math
import re
from itertools import repeat
from operator import contains
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cpersona.services.recall.fusion import VECTOR_CHANNELS, RankedList
from cpersona.storage.scope import Scope
from cpersona.storage.search import FUNCTION_WORDS, MAX_QUERY_CHARS, Hit, Record, RowKey, SearchBackend, clean_query

POOL_DEPTH = 50  # the trigram arm's rows read as candidates
RUN_POOL = 50  # rows read per probed run
MAX_PROBED_RUNS = 8
MAX_RUNS = 12
MAX_BIGRAMS = 48
STATS_SAMPLE = 2000  # newest rows in scope the document frequencies are counted over
# A shared content run counts this many bigrams, and a unit's repeats in one row
# saturate sooner than BM25's usual k1 = 1.2: a paragraph that names its subject
# (a title, a name) over and over outranked the one holding the question's rarer
# run once. Chosen on JSQuAD's tuning half only (docs/benchmarks.md, "fourth pass"):
# k1 0.5-0.9 with runs at 4 is one plateau there.
RUN_WEIGHT = 4.0
K1, B = 0.7, 0.75
INTERROGATIVES = "何誰"
PHRASE_MIN = 3  # the trigram index finds a run this long as a phrase


def _script(ch: str) -> str:
    """'h' hiragana, 'k' katakana, 'c' kanji, 'l' other letters and digits, ' ' a separator."""
    o = ord(ch)
    if 0x3041 <= o <= 0x309F:
        return "h"
    if ch == "\u30fb":  # katakana middle dot: a separator between names
        return " "
    if 0x30A0 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
        return "k"
    if 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or ch in "々〆ヶ":
        return "c"
    return "l" if ch.isalnum() else " "


# The characters _script reads as kana or kanji ("h", "k", "c"), as one class: every recall
# asks applies() twice, and the loop over _script cost ~20 µs on an English question.
_KANA_OR_KANJI = re.compile(
    "[\u3041-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3005\u3006]"
)


def applies(query: str) -> bool:
    """Whether ``query`` holds kana or kanji, so this reading serves it."""
    return _KANA_OR_KANJI.search(query[:MAX_QUERY_CHARS]) is not None


_ASCII_UPPER = re.compile("[A-Z]+")
_INTERROGATIVE = re.compile(f"[{INTERROGATIVES}]")


def fold(text: str) -> str:
    """ASCII letters lower-cased, nothing else (as SQLite's LIKE folds): cheap on kana and kanji."""
    return _ASCII_UPPER.sub(lambda m: m.group().lower(), text) if _ASCII_UPPER.search(text) else text


def _query_text(query: str) -> str:
    return fold(clean_query(query[:MAX_QUERY_CHARS]))


def content_runs(query: str) -> list[str]:
    """The query's content runs, ASCII lower-cased, in order of first appearance, no duplicates."""
    runs: dict[str, None] = {}
    current, kind = "", " "

    def close() -> None:
        if kind in "kc":
            for part in _INTERROGATIVE.split(current):
                if part:
                    runs.setdefault(part, None)
        elif kind == "l" and len(current) >= 2 and current not in FUNCTION_WORDS:
            runs.setdefault(current, None)  # a lone letter or an English function word ranks nothing

    for ch in _query_text(query):
        script = _script(ch)
        if script != kind:
            close()
            current, kind = "", script
        current += ch
        if len(runs) >= MAX_RUNS:
            break
    close()
    return list(runs)[:MAX_RUNS]


def _latin(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def bigrams(query: str) -> list[str]:
    """Adjacent character pairs of the query without its spaces, none inside a Latin word."""
    chars = "".join(_query_text(query).split())
    pairs: dict[str, None] = {}
    for a, b in zip(chars, chars[1:]):
        if not (_latin(a) and _latin(b)):
            pairs.setdefault(a + b, None)
            if len(pairs) >= MAX_BIGRAMS:
                break
    return list(pairs)


def units(query: str) -> dict[str, float]:
    """Each unit a candidate is scored on, with its weight (a run that is also a bigram adds both)."""
    weights = dict.fromkeys(bigrams(query), 1.0)
    for run in content_runs(query):
        weights[run] = weights.get(run, 0.0) + RUN_WEIGHT
    return weights


@dataclass(frozen=True, slots=True)
class _Weighting:
    idf: dict[str, float]
    weight: dict[str, float]
    mean_length: float

    def score(self, text: str) -> float:
        folded = fold(text)
        norm = K1 * (1.0 - B + B * len(folded) / self.mean_length) if self.mean_length > 0 else K1
        total = 0.0
        for unit, idf in self.idf.items():
            tf = folded.count(unit)
            if tf:
                total += self.weight[unit] * idf * tf * (K1 + 1.0) / (tf + norm)
        return total


@dataclass(frozen=True, slots=True)
class _Sample:
    """The scope's newest rows, folded: where document frequencies are counted and short runs probed."""

    ids: list[int]
    texts: list[str]

    @classmethod
    def read(cls, backend: SearchBackend, scope: Scope, source_id: str) -> _Sample:
        rows = backend.recent_texts(scope, STATS_SAMPLE, source_id=source_id)
        return cls([row_id for row_id, _ in rows], [fold(content) for _, content in rows])

    def holding(self, needle: str, depth: int) -> list[RowKey]:
        """The newest ``depth`` sampled rows holding ``needle``."""
        found: list[RowKey] = []
        for row_id, text in zip(self.ids, self.texts):
            if needle in text:
                found.append(("mem", row_id))
                if len(found) >= depth:
                    break
        return found

    def weighting(self, weights: dict[str, float], pool: Sequence[Record]) -> _Weighting:
        # A unit no candidate holds cannot change their order: it is not counted.
        held = [fold(record.text) for record in pool]
        rows = len(self.texts)
        idf = {}
        for unit in weights:
            if any(unit in text for text in held):
                frequency = sum(map(contains, self.texts, repeat(unit)))  # rows holding it, counted in C
                idf[unit] = math.log(1.0 + (rows - frequency + 0.5) / (frequency + 0.5))
        mean_length = sum(map(len, self.texts)) / rows if rows else 0.0
        return _Weighting(idf, {unit: weights[unit] for unit in idf}, mean_length)


def candidates(
    backend: SearchBackend, scope: Scope, query: str, depth: int, sample: _Sample, source_id: str
) -> dict[RowKey, Record]:
    """The rows worth scoring, in the order first found: the trigram arm's, then each run's."""
    pool: dict[RowKey, Record] = {}

    def take(records: Sequence[Record]) -> None:
        for record in records:
            pool.setdefault(record.key, record)

    first = backend.keyword_memories(scope, query, max(depth, POOL_DEPTH), source_id=source_id)
    take([hit.record for hit in first.hits])
    probes = content_runs(query)
    probed: set[str] = set()
    while probes and len(probed) < MAX_PROBED_RUNS:
        run = probes.pop(0)
        if run in probed:
            continue
        probed.add(run)
        if len(run) < PHRASE_MIN:  # no index can find it: the newest rows are searched
            wanted = [key for key in sample.holding(run, RUN_POOL) if key not in pool]
            fetched = backend.fetch(scope, wanted, source_id=source_id)
            take([fetched[key] for key in wanted if key in fetched])  # newest first
            continue
        found = backend.keyword_memories(scope, "", RUN_POOL, source_id=source_id, phrases=[run]).hits
        take([hit.record for hit in found])  # the index finds a long run whole, best bm25 first
        if not found and not _latin(run[0]):
            # A compound the rows spell apart (緊急連絡 vs 緊急の連絡): its two-character pieces.
            probes.extend(dict.fromkeys([*(run[i : i + 2] for i in range(0, len(run) - 1, 2)), run[-2:]]))
    return pool


def keyword_memories(backend: SearchBackend, scope: Scope, query: str, depth: int, *, source_id: str = "") -> list[Hit]:
    """The memories keyword arm for a kana/kanji query: best ``depth`` rows, ``Hit.raw`` = score."""
    if depth <= 0 or not clean_query(query):
        return []
    sample = _Sample.read(backend, scope, source_id)
    pool = candidates(backend, scope, query, depth, sample, source_id)
    if not pool:
        return []
    weighting = sample.weighting(units(query), list(pool.values()))
    scored = [(weighting.score(record.text), i, record) for i, record in enumerate(pool.values())]
    scored = [row for row in scored if row[0] > 0.0]
    scored.sort(key=lambda row: (-row[0], row[1]))
    return [Hit(record, score) for score, _, record in scored[:depth]]


# -- the vector channel on a kana/kanji query ---------------------------------------------

AGREE_TOP = 1  # the keyword rows, and the vector rows, whose agreement lets the vector lists vote


def vector_votes(lists: Sequence[RankedList]) -> Sequence[RankedList]:
    """The lists with the vector channel set aside (weight 0) unless it agrees with the keyword top.

    For a kana/kanji query the vector lists vote only when one of their first
    :data:`AGREE_TOP` rows is one of a keyword list's first :data:`AGREE_TOP`
    rows (or no keyword list has a row). This reading is precise at its top
    (JSQuAD R@1 0.92) and most embedders a user plugs in read English only:
    all-MiniLM-L6-v2's first row is the paragraph asked about 19% of the time,
    and with its votes R@1 fell to 0.84 even behind ``fusion.vector_votes``. An
    embedder is not asked which languages it reads (an HTTP one cannot say):
    its own list, query by query, shows whether it found what the text
    search found. When it did, the shared first row stays first and the
    vector votes order the rest; when it did not, the answer is keyword-only
    recall's. English queries never take this rule.
    """
    lexical = [lst for lst in lists if lst.channel not in VECTOR_CHANNELS and lst.entries]
    vector = [lst for lst in lists if lst.channel in VECTOR_CHANNELS and lst.entries]
    if not lexical or not vector:
        return lists
    top = {entry.key for lst in lexical for entry in lst.entries[:AGREE_TOP]}
    if any(entry.key in top for lst in vector for entry in lst.entries[:AGREE_TOP]):
        return lists
    return [replace(lst, weight=0.0) if lst.channel in VECTOR_CHANNELS else lst for lst in lists]
