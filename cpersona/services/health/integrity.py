"""Checks 11-15: FTS, schema and file integrity (spec R-23..R-27).

All five look at the whole database whatever agent the call names (R-10).
The canonical definitions of indexes and triggers are read from the Alembic
revisions, the single copy of our DDL, so this check cannot drift from them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from cpersona.services.health.registry import Check, Ctx, Issue, has_object
from cpersona.storage import health_probes as probes
from cpersona.storage.foreign import schema_version
from cpersona.storage.migrate import REFERENCE_VERSION, _script

FTS = {"memories_fts": "memories", "episodes_fts": "episodes"}
# The word indexes of revision 0006 (issue 14): full-text objects too, checked and rebuilt the same
# way; their issues name the index, since "table" alone names the trigram one.
WORD_FTS = {"memories_words": "memories", "episodes_words": "episodes"}
_NAME = re.compile(r"^CREATE\s+(UNIQUE\s+)?(INDEX|TRIGGER)\s+(IF\s+NOT\s+EXISTS\s+)?(\w+)\s+", re.I)
_ON = re.compile(r"\bON\s+(\w+)", re.I)
_CRITICAL = frozenset(
    {
        "idx_memories_dedup_content",
        "idx_memories_dedup_msg_id",
        "memories_fts_ai",
        "memories_fts_ad",
        "memories_fts_au",
        "episodes_ai",
        "episodes_ad",
        "episodes_au",
        "record_nodes_memories_ad",
        "record_nodes_memories_au",
        "record_nodes_episodes_ad",
        "record_nodes_episodes_au",
        "associations_entities_ad",
        "associations_memories_ad",
        "associations_episodes_ad",
        "memories_words_ai",
        "memories_words_ad",
        "memories_words_au",
        "episodes_words_ai",
        "episodes_words_ad",
        "episodes_words_au",
    }
)
FTS_TRIGGERS = frozenset(
    {
        "memories_fts_ai",
        "memories_fts_ad",
        "memories_fts_au",
        "episodes_ai",
        "episodes_ad",
        "episodes_au",
        "memories_words_ai",
        "memories_words_ad",
        "memories_words_au",
        "episodes_words_ai",
        "episodes_words_ad",
        "episodes_words_au",
    }
)
# Canonical names the spec lists for features this build does not have (blocks, vector
# logs, folders, ...) are absent from our revisions, so they are never expected here.


def _sqlite(ctx: Ctx) -> bool:
    return ctx.app.db.is_sqlite


# -- 11: fts_integrity --------------------------------------------------------------------------


def detect_fts(ctx: Ctx) -> list[Issue]:
    if not ctx.settings.fts_enabled or not _sqlite(ctx):
        return []
    issues = []
    for fts, table in (*FTS.items(), *WORD_FTS.items()):
        if has_object(ctx.conn, "table", fts):
            ok = probes.fts_verifies(ctx.conn, fts) if ctx.fix else probes.fts_verifies_alone(ctx.app.db.engine, fts)
            if ok:
                continue
        issue = {"type": "fts_integrity_failure", "table": table, "severity": "critical", "repairable": 1}
        if fts in WORD_FTS:
            issue["index"] = fts
        issues.append(issue)
    return issues


def repair_fts(ctx: Ctx, issues: list[Issue]) -> None:
    ddl = dict(zip(FTS, _revision_module("0001_v13").FTS_TABLES_DDL))
    words = _revision_module("0006_word_index")
    ddl.update(zip(WORD_FTS, words.WORD_TABLES_DDL))
    for issue in issues:
        fts = issue.get("index") or f"{issue['table']}_fts"
        try:
            probes.rebuild_fts(ctx.conn, fts, ddl[fts])
            issue["fixed"] = probes.fts_verifies(ctx.conn, fts)
        except DBAPIError as exc:
            issue["fixed"], issue["fix_error"] = False, str(exc.orig)


# -- 12: schema_version -------------------------------------------------------------------------


def detect_schema_version(ctx: Ctx) -> list[Issue]:
    # an unreadable version raises (the runner reports check_crashed), never reads as current.
    version = schema_version(ctx.conn)
    if version is None or int(version) != REFERENCE_VERSION:
        return [{"type": "schema_version_mismatch", "db_version": version, "expected": REFERENCE_VERSION}]
    return []


# -- 13: dedup_msg_id_index ---------------------------------------------------------------------

MSG_ID_INDEX = "idx_memories_dedup_msg_id"


def detect_msg_id_index(ctx: Ctx) -> list[Issue]:
    if not ctx.has_table("memories") or has_object(ctx.conn, "index", MSG_ID_INDEX):
        return []
    return [{"type": "dedup_msg_id_index_missing", "object": MSG_ID_INDEX, "repairable": 1}]


def repair_msg_id_index(ctx: Ctx, issues: list[Issue]) -> None:
    # R-25, every agent: keep the msg_id of the highest-id locked row (else the highest id)
    # and blank it on the other unlocked rows of the group. No row is deleted.
    probes.blank_colliding_msg_ids(ctx.conn)
    statement = next(s for s in _canonical_statements().values() if s.name == MSG_ID_INDEX).sql
    for issue in issues:
        try:
            probes.create_object(ctx.conn, statement)
            issue["fixed"] = True
        except DBAPIError as exc:
            issue["fixed"], issue["fix_error"] = False, f"locked rows still collide on msg_id: {exc.orig}"


# -- 14: schema_objects -------------------------------------------------------------------------


@dataclass(frozen=True)
class Canonical:
    name: str
    kind: str  # index | trigger
    table: str
    sql: str
    unique: bool

    @property
    def severity(self) -> str:
        return "critical" if self.name in _CRITICAL else "warn"


def _revision_module(revision: str) -> Any:
    return _script().get_revision(revision).module


def _statements(module: Any) -> Iterator[str]:
    for name, value in vars(module).items():
        # PG_* tuples hold the PostgreSQL twins of the same objects; this check reads SQLite's.
        if isinstance(value, tuple) and not name.startswith("PG_"):
            yield from (v for v in value if isinstance(v, str))


@functools.cache
def _canonical_statements() -> dict[str, Canonical]:
    found: dict[str, Canonical] = {}
    for revision in reversed(list(_script().walk_revisions())):
        for sql in _statements(revision.module):
            match = _NAME.match(sql.strip())
            if not match:
                continue
            on = _ON.search(sql[match.end(0) - 1 :])
            table = on.group(1) if on else ""
            kind = match.group(2).lower()
            found[match.group(4)] = Canonical(match.group(4), kind, table, sql, bool(match.group(1)))
    return found


# One SQL token: a comment or whitespace (dropped), a string or blob literal (kept
# verbatim: 'delete' and 'DELETE' differ), a quoted identifier ("x", [x], `x`), a
# word, a number, or an operator (longest first).
_TOKEN = re.compile(
    r"""
    (?P<skip>\s+|--[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<string>[xX]?'(?:[^']|'')*')
  | "(?P<dq>(?:[^"]|"")*)" | \[(?P<br>[^\]]*)\] | `(?P<bt>(?:[^`]|``)*)`
  | (?P<word>[^\W\d]\w*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<op><>|!=|<=|>=|==|<<|>>|\|\||.)
""",
    re.VERBOSE | re.DOTALL,
)
_SAME_OP = {"<>": "!=", "==": "="}  # SQLite spells these two operators two ways each


def _tokens(sql: str) -> list[str]:
    out: list[str] = []
    for m in _TOKEN.finditer(sql):
        kind = m.lastgroup
        if kind == "skip":
            continue
        if kind == "string":
            out.append(m.group(0))
        elif kind == "op":
            out.append(_SAME_OP.get(m.group(0), m.group(0)))
        else:
            # Keywords and identifiers are case-insensitive in SQLite; a quoted
            # identifier is the same name as the bare one.
            ident = m.group(kind)
            for quote in ('"', "`"):
                ident = ident.replace(quote * 2, quote)
            out.append(ident.lower())
    return out


def canonical_form(sql: str | None) -> str:
    """``sql`` as a token string that two spellings of one definition share (R-26).

    Layout, comments, keyword and identifier case, identifier quoting,
    ``IF NOT EXISTS`` and trailing semicolons are not part of a definition;
    string literals, names, columns, order and conditions are.
    """
    if not sql:
        return ""
    tokens = _tokens(sql)
    while tokens and tokens[-1] == ";":
        tokens.pop()
    for i in range(len(tokens) - 2):
        if tokens[i : i + 3] == ["if", "not", "exists"]:
            del tokens[i : i + 3]
            break
    return " ".join(tokens)


def expected_objects(ctx: Ctx) -> list[Canonical]:
    out = []
    for obj in _canonical_statements().values():
        if obj.kind == "trigger" and obj.name in FTS_TRIGGERS and not ctx.settings.fts_enabled:
            continue
        if obj.table and not has_object(ctx.conn, "table", obj.table):
            continue  # the feature's tables are absent: nothing there to guard
        out.append(obj)
    return out


def _drift(ctx: Ctx) -> list[tuple[Canonical, str, str | None]]:
    out = []
    for obj in expected_objects(ctx):
        stored = probes.stored_definition(ctx.conn, obj.kind, obj.name)
        if stored is None:
            out.append((obj, "missing", None))
        elif canonical_form(stored) != canonical_form(obj.sql):
            out.append((obj, "definition_drift", stored))
    return out


def detect_schema_objects(ctx: Ctx) -> list[Issue]:
    if not _sqlite(ctx):
        return []
    return [
        {
            "type": "schema_object_drift",
            "object": obj.name,
            "kind": obj.kind,
            "state": state,
            "severity": obj.severity,
            "repairable": 1,
        }
        for obj, state, _ in _drift(ctx)
    ]


def repair_schema_objects(ctx: Ctx, issues: list[Issue]) -> None:
    drifted = {obj.name: (obj, stored) for obj, _, stored in _drift(ctx)}
    for issue in issues:
        obj, stored = drifted.get(issue["object"], (None, None))
        if obj is None:
            issue["fixed"] = True  # repaired earlier in this run (dedup_msg_id_index)
            continue
        if obj.unique and (groups := probes.duplicate_groups(ctx.conn, obj.name)):
            issue["fixed"] = False
            issue["fix_error"] = (
                f"{groups} duplicate group(s) across all agents would violate {obj.name}; "
                "resolve them (duplicate_content / dedup_msg_id_index) first"
            )
            continue
        try:
            probes.create_object(ctx.conn, obj.sql, replacing=None if stored is None else (obj.kind, obj.name))
            issue["fixed"] = True
        except DBAPIError as exc:
            # The savepoint undid the drop too, so the previous definition is back in place.
            issue["fixed"], issue["fix_error"] = False, str(exc.orig)
            if stored is not None:
                issue["restored"] = True


# -- 15: sqlite_integrity -----------------------------------------------------------------------


def detect_sqlite_integrity(ctx: Ctx) -> list[Issue]:
    if not _sqlite(ctx):
        return []
    try:
        messages = probes.quick_check(ctx.conn)
    except DBAPIError as exc:
        messages = [str(exc.orig)]
    if messages == ["ok"]:
        return []
    # rule out a stale structure cache of this connection before reporting damage.
    if ctx.app.db.path is not None:
        try:
            messages = probes.quick_check_file(ctx.app.db.path)
        except Exception as exc:  # noqa: BLE001 — an unreadable file is the finding itself
            messages = [str(exc)]
        if messages == ["ok"]:
            return []
    return [{"type": "sqlite_integrity_failure", "detail": "; ".join(messages[:10]), "severity": "critical"}]


CHECKS = [
    Check("fts_integrity", "warn", detect_fts, repair_fts, whole_database=True),
    Check("schema_version", "critical", detect_schema_version, whole_database=True),
    Check(
        "dedup_msg_id_index",
        "critical",
        detect_msg_id_index,
        repair_msg_id_index,
        cross_agent=True,
        whole_database=True,
    ),
    Check("schema_objects", "critical", detect_schema_objects, repair_schema_objects, whole_database=True),
    Check("sqlite_integrity", "critical", detect_sqlite_integrity, whole_database=True),
]
