"""Checks 1-4: memory text that needs rewriting or removing (spec R-12..R-16).

The rewrites share one rule (R-14): the new text replaces the content, the
vector is cleared so the re-embed pass refills it, and a rewrite that lands on
an identical row of the same bucket folds into that row (declarations follow
it) instead of breaking the uniqueness index. Locked rows are never touched.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from cpersona.services.health.registry import Check, Ctx, Issue
from cpersona.storage import dialect

_ANNOTATION = re.compile(r"\[Memory from [^\]]*\]\s*")
_MENTION = re.compile(r"<@!?\d+>")
CHUNK = 500


def _fixed_point(pattern: re.Pattern[str], value: str) -> str:
    # A removal can join two halves into a new match, so repeat until stable.
    while True:
        cleaned = pattern.sub("", value)
        if cleaned == value:
            return value.strip()
        value = cleaned


def clean_annotations(value: str) -> str:
    return _fixed_point(_ANNOTATION, value)


def clean_mentions(value: str) -> str:
    return _fixed_point(_MENTION, value)


# -- shared write helpers -----------------------------------------------------------------


def repoint_declarations(ctx: Ctx, old_id: int, new_id: int) -> None:
    """Move declarations naming mem:old onto mem:new before old is deleted (R-14, R-16)."""
    if old_id == new_id or not ctx.has_table("relations"):
        return
    old, new = f"mem:{old_id}", f"mem:{new_id}"
    # A row whose moved copy would collide with one the survivor already carries
    # stays put (what SQLite's UPDATE OR IGNORE did, spelled for every engine);
    # the deletion trigger removes it with the old row afterwards.
    ctx.run("UPDATE entity_mentions SET ref = :new WHERE ref = :old AND NOT EXISTS (SELECT 1 FROM entity_mentions t "
            "WHERE t.entity_id = entity_mentions.entity_id AND t.ref = :new)", old=old, new=new)
    _repoint_relations(ctx, "subject_id", "subject_kind = 'mem' AND subject_id = :old", old=old_id, new=new_id)
    _repoint_relations(ctx, "object_id", "object_kind = 'mem' AND object_id = :old", old=old_id, new=new_id)
    _repoint_relations(ctx, "anchor_ref", "anchor_ref = :old", old=old, new=new)


# The relations' unique key (storage.md §6.2).
_RELATION_KEY = ("agent_id", "project_id", "channel", "subject_kind", "subject_id", "predicate", "object_kind",
                 "object_id", "anchor_ref")


def _repoint_relations(ctx: Ctx, column: str, where: str, **params: Any) -> None:
    same = " AND ".join(f"t.{c} = relations.{c}" for c in _RELATION_KEY if c != column)
    ctx.run(f"UPDATE relations SET {column} = :new WHERE {where} "
            f"AND NOT EXISTS (SELECT 1 FROM relations t WHERE t.{column} = :new AND {same})", **params)


def delete_unlocked(ctx: Ctx, ids: list[int]) -> int:
    deleted = 0
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        marks = ", ".join(str(int(i)) for i in chunk)
        if ctx.settings.vector_search_mode == "remote":  # H-6: the owners, read before the rows go
            ctx.removed.update(("mem", r.id, r.agent_id) for r in ctx.rows(
                f"SELECT id, agent_id FROM memories WHERE locked = 0 AND id IN ({marks})"))
        deleted += ctx.run(f"DELETE FROM memories WHERE locked = 0 AND id IN ({marks})")
    return deleted


def rewrite_content(ctx: Ctx, row_id: int, new_text: str) -> str:
    """Apply one rewrite (R-14); returns 'rewritten', 'folded' or 'skipped'."""
    row = ctx.rows("SELECT agent_id, project_id, channel, locked FROM memories WHERE id = :i", i=row_id)
    if not row or row[0].locked:
        return "skipped"
    agent, project, channel, _ = row[0]
    twin = ctx.scalar(
        "SELECT id FROM memories WHERE agent_id = :a AND project_id = :p AND channel = :c AND content = :t "
        "AND id != :i ORDER BY locked DESC, id LIMIT 1", a=agent, p=project, c=channel, t=new_text, i=row_id)
    if twin is not None:
        repoint_declarations(ctx, row_id, twin)
        ctx.run("DELETE FROM memories WHERE id = :i AND locked = 0", i=row_id)
        ctx.removed.add(("mem", row_id, agent))
        return "folded"
    ctx.run("UPDATE memories SET content = :t, embedding = NULL WHERE id = :i AND locked = 0", t=new_text, i=row_id)
    ctx.nulled.add("memories")
    ctx.rewritten.add(("mem", row_id))
    return "rewritten"


# -- 1, 2: text contamination ---------------------------------------------------------------


def _cleaning_check(name: str, needle: str, cleaner: Callable[[str], str]) -> Check:
    def candidates(ctx: Ctx) -> list[Any]:
        where, params = ctx.where()
        return ctx.rows(f"SELECT id, content, locked FROM memories WHERE {where} "
                        f"AND {dialect.position(ctx.conn, 'content', ':needle')} > 0",
                        needle=needle, **params)

    def detect(ctx: Ctx) -> list[Issue]:
        rows = candidates(ctx)
        if not rows:
            return []
        repairable = sum(1 for r in rows if not r.locked and cleaner(r.content) != r.content)
        return [{"type": name, "count": len(rows), "repairable": repairable}]

    def repair(ctx: Ctx, issues: list[Issue]) -> None:
        for row in candidates(ctx):
            cleaned = cleaner(row.content)
            if not row.locked and cleaned != row.content:
                rewrite_content(ctx, row.id, cleaned)

    return Check(name, "info", detect, repair)


MEMORY_ANNOTATION = _cleaning_check("memory_annotation", "[Memory from", clean_annotations)
DISCORD_MENTION = _cleaning_check("discord_mention", "<@", clean_mentions)


# -- 3: oversized content -------------------------------------------------------------------


def _cap(ctx: Ctx) -> int:
    cap = int(ctx.settings.max_content_length)
    if cap < 1:
        # a nonsensical cap must not empty every row; crash the check instead.
        raise ValueError(f"CPERSONA_MAX_CONTENT_LENGTH must be at least 1 (got {cap})")
    return cap


def detect_oversized(ctx: Ctx) -> list[Issue]:
    cap = _cap(ctx)
    where, params = ctx.where()
    row = ctx.rows(f"SELECT COUNT(*) AS n, COALESCE({dialect.count_if('locked = 0')}, 0) AS unlocked FROM memories "
                   f"WHERE {where} AND length(content) > :cap", cap=cap, **params)[0]
    if not row.n:
        return []
    return [{"type": "oversized_content", "count": row.n, "repairable": int(row.unlocked), "max_len": cap}]


def repair_oversized(ctx: Ctx, issues: list[Issue]) -> None:
    cap = _cap(ctx)
    where, params = ctx.where()
    ids = [r.id for r in ctx.rows(f"SELECT id FROM memories WHERE {where} AND locked = 0 "
                                  f"AND length(content) > :cap", cap=cap, **params)]
    for row_id in ids:
        content = ctx.scalar("SELECT content FROM memories WHERE id = :i", i=row_id)
        rewrite_content(ctx, row_id, content[:cap])


OVERSIZED_CONTENT = Check("oversized_content", "warn", detect_oversized, repair_oversized)


# -- 4: duplicate content -------------------------------------------------------------------


def covered_rows(ctx: Ctx) -> list[tuple[tuple[str, str, str], int, bool, int]]:
    """(group key, row id, locked, covering row id) for every covered row (R-16)."""
    where, params = ctx.where("m")
    rows = ctx.rows(
        f"SELECT m.id, m.agent_id, m.project_id, m.channel, m.content, m.locked FROM memories m "
        f"JOIN (SELECT agent_id, project_id, content FROM memories GROUP BY agent_id, project_id, content "
        f"HAVING COUNT(*) > 1) g ON g.agent_id = m.agent_id AND g.project_id = m.project_id "
        f"AND g.content = m.content WHERE {where} ORDER BY m.id", **params)
    groups: dict[tuple[str, str, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r.agent_id, r.project_id, r.content)][r.channel].append(r)
    out = []
    for key, buckets in groups.items():
        # The keeper of a bucket: its lowest-id locked row, else its lowest-id row.
        keepers = {ch: min(rs, key=lambda r: (not r.locked, r.id)).id for ch, rs in buckets.items()}
        for channel, members in buckets.items():
            for r in members:
                named_under_global = channel != "" and "" in buckets
                if r.id == keepers[channel] and not named_under_global:
                    continue
                target = keepers[""] if "" in buckets else keepers[channel]
                out.append((key, r.id, bool(r.locked), target))
    return out


def detect_duplicates(ctx: Ctx) -> list[Issue]:
    covered = covered_rows(ctx)
    if not covered:
        return []
    return [{"type": "duplicate_content", "groups": len({c[0] for c in covered}), "total_extra": len(covered),
             "repairable": sum(1 for c in covered if not c[2])}]


def repair_duplicates(ctx: Ctx, issues: list[Issue]) -> None:
    doomed = [(row_id, target) for _, row_id, locked, target in covered_rows(ctx) if not locked]
    for row_id, target in doomed:
        repoint_declarations(ctx, row_id, target)
    delete_unlocked(ctx, [row_id for row_id, _ in doomed])


DUPLICATE_CONTENT = Check("duplicate_content", "warn", detect_duplicates, repair_duplicates)

CHECKS = [MEMORY_ANNOTATION, DISCORD_MENTION, OVERSIZED_CONTENT, DUPLICATE_CONTENT]
