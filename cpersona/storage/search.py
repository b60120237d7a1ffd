"""The search primitives recall is built from, independent of the database engine.

Recall never writes SQL itself: it asks a :class:`SearchBackend` for ranked
candidates (keyword search over memories and over episodes, the recency
listing, the vector scan), for the size of the gated pool, for rows by
reference and for the few scope facts the scoring step needs.
``search_sqlite`` serves them with FTS5 trigram indexes and sqlite-vec
(``vectors_sqlite``); a PostgreSQL backend (pg_trgm) plugs in behind the same
interface.

Every primitive takes a :class:`~cpersona.storage.scope.Scope` and applies it
inside its own query (spec ISO-2): a result list is already isolated, so no
caller can forget to filter it, and no other agent's rows can crowd the depth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from cpersona.storage.scope import Scope

Kind = Literal["mem", "ep"]
RowKey = tuple[str, int]  # ("mem" | "ep", id): the identity fusion votes on

# Bounds on what one query can cost. Only the head of a very long query is
# tokenised, and only its first terms are searched: every extra OR term is one
# more posting list to rank, and ranking cost grows with the number of hits.
MAX_QUERY_CHARS = 8192
MAX_TERMS = 64

_EDGE_PUNCTUATION = "\"'`.,;:!?()[]{}"
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f"
_RUNS = re.compile(f"[{_CJK}]+|[^\\s{_CJK}]+")
_CJK_RUN = re.compile(f"[{_CJK}]")
# NUL and the other C0/C1 controls are never meaningful in a search; reading
# them as spaces keeps them out of MATCH expressions and LIKE patterns, where a
# NUL would silently end the pattern early.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_query(query: str) -> str:
    """The query with control characters read as spaces, trimmed."""
    return _CONTROLS.sub(" ", query).strip()


def query_terms(query: str) -> list[str]:
    """The substrings a trigram index can look up for ``query`` (spec §5.7.1).

    Whitespace-separated words lose surrounding punctuation; runs of CJK text
    contribute every 3-character window (a trigram index cannot match less, and
    Japanese has no spaces to split on); other runs of 3 or more characters
    count whole, inner punctuation kept (``CVE-2024-3094``). Order of first
    appearance, no duplicates, at most :data:`MAX_TERMS`.
    """
    words = (w.strip(_EDGE_PUNCTUATION) for w in clean_query(query[:MAX_QUERY_CHARS]).split())
    terms: dict[str, None] = {}
    for run in _RUNS.findall(" ".join(w for w in words if w)):
        if _CJK_RUN.match(run):
            pieces = [run[i : i + 3] for i in range(len(run) - 2)]
        else:
            pieces = [run] if len(run) >= 3 else []
        for piece in pieces:
            terms.setdefault(piece, None)
            if len(terms) >= MAX_TERMS:
                return list(terms)
    return list(terms)


def phrase_terms(phrases: Iterable[str], terms: Iterable[str] = ()) -> list[str]:
    """Extra terms searched whole, spaces included (a multi-word name as one phrase).

    Each phrase is cleaned and trimmed; one shorter than 3 characters is left
    out (a trigram index cannot match it), and so is one already among
    ``terms`` or an earlier phrase (compared case-folded, as the index folds).
    At most :data:`MAX_TERMS`.
    """
    seen = {term.casefold() for term in terms}
    kept: list[str] = []
    for phrase in phrases:
        text = " ".join(clean_query(phrase[:MAX_QUERY_CHARS]).split())
        if len(text) < 3 or text.casefold() in seen:
            continue
        seen.add(text.casefold())
        kept.append(text)
        if len(kept) >= MAX_TERMS:
            break
    return kept


# English function words of 3+ letters (shorter words never become terms). A
# question's "what", "did", "the" match nearly every row (and, as trigram
# substrings, "there", "other", "theory"), so ranking on them buries the rows
# that share the question's content words. LoCoMo keyword-only, 760 questions:
# R@10 0.562 -> 0.592 (plain BM25 0.571). Temporal connectives ("until",
# "while", "because") stay: they carry meaning in the questions measured.
FUNCTION_WORDS = frozenset(
    """about above after again against all and any are been before being below between both
    but can could did does doing down during each few for from further had has have having
    her here hers herself him himself his how into its itself just more most myself nor not
    now off once only other our ours ourselves out over own same she should some such than
    that the their theirs them themselves then there these they this those through too under
    very was were what when where which who whom why will with would you your yours yourself
    yourselves""".split()
)


def ranking_terms(terms: list[str]) -> list[str]:
    """``terms`` without function words, or all of them when nothing else is left."""
    kept = [term for term in terms if term.lower() not in FUNCTION_WORDS]
    return kept or terms


@dataclass(frozen=True, slots=True)
class Record:
    """One memory or episode as recall sees it.

    ``text`` is the stored text without any label (a memory's content, an
    episode's summary); ``timestamp`` is what the response shows (a memory's
    caller stamp; an episode's start_time, else its created_at).
    """

    kind: Kind
    id: int
    text: str
    source: str  # stored JSON text; '' for episodes (they carry no per-user source)
    timestamp: str
    msg_id: str = ""
    created_at: str = ""
    resolved: bool = False
    has_embedding: bool = False
    recall_count: int = 0
    last_recalled_at: str | None = None
    ended_at: str = ""  # an episode's end_time (its history's last stamp); '' for memories

    @property
    def written_at(self) -> str:
        """When the row's text was written, on the caller's clock where there is one.

        A memory: its timestamp. An episode: the end of its history, else when
        it was archived (the start would age an episode by its own length).
        """
        if self.kind == "mem":
            return self.timestamp
        return self.ended_at or self.created_at

    @property
    def key(self) -> RowKey:
        return (self.kind, self.id)

    @property
    def ref(self) -> str:
        return f"{self.kind}:{self.id}"

    @property
    def content(self) -> str:
        """The text as recall shows it (episodes carry their label)."""
        return f"[Episode] {self.text}" if self.kind == "ep" else self.text


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved row and the retriever's own score for it.

    ``raw`` is on the retriever's native scale, higher is better (for FTS5 this
    is ``-bm25``); ``None`` when the retriever has no score (LIKE, recency).
    """

    record: Record
    raw: float | None = None


@dataclass(frozen=True, slots=True)
class KeywordResult:
    """The memories keyword arm: its hits and how they were found."""

    hits: list[Hit]
    method: Literal["fts", "like", "none"]


@dataclass(frozen=True, slots=True)
class WordSpread:
    """The query's content words over a scope (:meth:`SearchBackend.word_spread`)."""

    rows: int  # memories in scope and source, counted up to the cap
    counts: dict[str, int]  # word -> memories in scope holding it, counted just past the share asked about
    held: dict[int, frozenset[str]]  # memory id -> the words it holds (ids holding none are left out)


class SearchBackend(Protocol):
    """What recall needs from a database. Every method applies ``scope`` itself."""

    def keyword_memories(
        self, scope: Scope, query: str, depth: int, *, source_id: str = "", phrases: Sequence[str] = ()
    ) -> KeywordResult:
        """Memories matching ``query``, best first, at most ``depth``.

        Full-text search where it can serve the query; otherwise (no usable
        term, no match, index disabled or failing) a newest-first substring
        match standing in for it (spec KW-1). ``phrases`` are OR-ed in as
        whole phrases (:func:`phrase_terms`), never split into words: the
        declared names reconstruct adds to its lexical arms (spec RX-8).
        """
        ...

    def keyword_episodes(self, scope: Scope, query: str, depth: int, *, phrases: Sequence[str] = ()) -> list[Hit]:
        """Episodes whose summary or keywords match ``query`` or one of ``phrases``, best first."""
        ...

    def word_memories(self, scope: Scope, query: str, depth: int, *, source_id: str = "") -> list[Hit]:
        """Memories holding one of the query's Latin-script content words, stemmed, best first
        (the word channel, :mod:`cpersona.storage.search_words`); [] when the query has none."""
        ...

    def word_episodes(self, scope: Scope, query: str, depth: int) -> list[Hit]:
        """Episodes whose summary or keywords hold one of the query's content words, best first."""
        ...

    def word_spread(
        self, scope: Scope, query: str, ids: Sequence[int], *, source_id: str = "", cap: int, share: float
    ) -> WordSpread | None:
        """How widely each of the query's content words (the word channel's terms) is spread over the
        memories in scope and source, and which of them each of the memories ``ids`` holds
        (``services/recall/common_words.py``). None when the query has no such word or the word
        index cannot say. The scope is counted up to ``cap`` rows (reaching it, or an empty scope,
        gives the count alone); each word's count stops just past ``share`` of the scope's rows,
        enough to tell whether more than that share holds it."""
        ...

    def recent_memories(self, scope: Scope, depth: int, *, source_id: str = "") -> list[Hit]:
        """The ``depth`` newest memories in scope (created_at desc, id desc)."""
        ...

    def recent_texts(self, scope: Scope, depth: int, *, source_id: str = "") -> list[tuple[int, str]]:
        """(id, content) of the ``depth`` newest memories, in :meth:`recent_memories` order."""
        ...

    def next_memories(self, scope: Scope, ids: Sequence[int], *, source_id: str = "", reach: int) -> dict[int, Record]:
        """For each of ``ids``, the memory stored right after it in scope and source (the
        smallest larger id, at most ``reach`` ids on), keyed by that id; ids with none are left out."""
        ...

    def pool_count(self, scope: Scope, *, cap: int | None = None) -> int:
        """Memories plus episodes in scope: the pool the quality gate scales with.

        With ``cap``, ``min(count, cap)``, which stops counting at the cap.
        """
        ...

    def table_counts(self, scope: Scope, *, cap: int | None = None) -> tuple[int, int]:
        """(memories, episodes) in scope, each ``min(count, cap)`` with ``cap``."""
        ...

    def fetch(self, scope: Scope, keys: Iterable[RowKey], *, source_id: str = "") -> dict[RowKey, Record]:
        """Rows by reference, silently omitting any outside ``scope`` (and, for
        memories, any that ``source_id`` filters out as in the keyword arm)."""
        ...

    def episode_boundary(self, scope: Scope) -> datetime | None:
        """The instant the newest episode in scope was archived, if any."""
        ...

    def memory_span(self, scope: Scope, *, date_shaped_only: bool) -> tuple[datetime | None, datetime | None]:
        """The oldest and newest instant among the scope's memory timestamps, as aware UTC datetimes.

        Stamps are caller strings with any offset, so the engine orders them by
        instant (naive = UTC), not as text; unreadable and empty stamps take no
        part. ``date_shaped_only`` also leaves out stamps not starting
        ``YYYY-MM-DD`` (a bare number the engine would read as a Julian day).
        (None, None) when no stamp counts.
        """
        ...

    def period_rows(
        self, scope: Scope, start: datetime, end: datetime, words: Sequence[str], *, source_id: str = "", depth: int
    ) -> list[RowKey]:
        """Memories (by timestamp) and episodes (by start, else created_at) in [start, end), best first.

        A row must hold one of ``words`` (substring, case-folded; memories'
        content, episodes' summary or keywords) unless ``words`` is empty;
        best = most words held, then newest instant, then highest id. At most
        ``depth`` over both kinds. ``source_id`` filters memories as in the
        keyword arm.
        """
        ...

    def profile(self, agent_id: str) -> str | None:
        """The agent's profile text (profiles are per agent only, spec ISO-5)."""
        ...

    def vector_candidates(
        self,
        kind: Kind,
        scope: Scope,
        query: bytes,
        depth: int,
        *,
        threshold: float,
        window: tuple[int, int],
        source_id: str = "",
    ) -> list[Hit]:
        """Rows of ``kind`` whose stored vector is closest to ``query``, best first (spec §5.6).

        ``query`` is a little-endian float32 blob. Only the scope's rows with a
        vector of the same width are scanned (VEC-3), newest first (created_at
        desc, id asc); ``window`` = (start, stop) picks scan positions
        [start, stop) of that order — (0, MAX_MEMORIES) is the near list, the
        positions after it the far list (VEC-2, VEC-7). Rows whose cosine is
        below ``threshold`` are dropped; at most ``depth`` come back, ordered by
        (cosine desc, scan position asc). ``Hit.raw`` is the cosine.
        ``source_id`` filters memories as in the keyword arm; episodes ignore it.
        """
        ...


def open_search(db, *, fts_enabled: bool = True) -> SearchBackend:
    """The SearchBackend for ``db``'s engine: the one place the choice is made."""
    if db.is_sqlite:
        from cpersona.storage.search_words import SqliteWordSearch

        return SqliteWordSearch(db, fts_enabled=fts_enabled)
    if db.dialect == "postgresql":
        from cpersona.storage.search_words_postgres import PostgresWordSearch

        return PostgresWordSearch(db, fts_enabled=fts_enabled)
    raise ValueError(f"no search backend for the {db.dialect} database engine")
