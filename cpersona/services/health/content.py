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
from cpersona.storage import health_probes as probes

_ANNOTATION = re.compile(r"\[Memory from [^\]]*\]\s*")
_MENTION = re.compile(r"<@!?\d+>")


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
    probes.repoint_declarations(ctx.conn, old_id, new_id)


def delete_unlocked(ctx: Ctx, ids: list[int]) -> int:
    # H-6: in remote mode the owners are read before the rows go.
    removed = ctx.removed if ctx.settings.vector_search_mode == "remote" else None
    return probes.delete_unlocked_memories(ctx.conn, ids, owners=removed)


def rewrite_content(ctx: Ctx, row_id: int, new_text: str) -> str:
    """Apply one rewrite (R-14); returns 'rewritten', 'folded' or 'skipped'."""
    row = probes.memory_bucket(ctx.conn, row_id)
    if row is None or row.locked:
        return "skipped"
    agent, project, channel, _ = row
    twin = probes.twin_of(ctx.conn, agent, project, channel, new_text, row_id)
    if twin is not None:
        repoint_declarations(ctx, row_id, twin)
        probes.delete_unlocked_memory(ctx.conn, row_id)
        ctx.removed.add(("mem", row_id, agent))
        return "folded"
    probes.rewrite_unlocked_memory(ctx.conn, row_id, new_text)
    ctx.nulled.add("memories")
    ctx.rewritten.add(("mem", row_id))
    return "rewritten"


# -- 1, 2: text contamination ---------------------------------------------------------------


def _cleaning_check(name: str, needle: str, cleaner: Callable[[str], str]) -> Check:
    def candidates(ctx: Ctx) -> list[Any]:
        return probes.memories_containing(ctx.conn, ctx.agent_id, needle)

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
    row = probes.oversized_counts(ctx.conn, ctx.agent_id, cap)
    if not row.n:
        return []
    return [{"type": "oversized_content", "count": row.n, "repairable": int(row.unlocked), "max_len": cap}]


def repair_oversized(ctx: Ctx, issues: list[Issue]) -> None:
    cap = _cap(ctx)
    for row_id in probes.oversized_unlocked_ids(ctx.conn, ctx.agent_id, cap):
        content = probes.memory_content(ctx.conn, row_id)
        rewrite_content(ctx, row_id, content[:cap])


OVERSIZED_CONTENT = Check("oversized_content", "warn", detect_oversized, repair_oversized)


# -- 4: duplicate content -------------------------------------------------------------------


def covered_rows(ctx: Ctx) -> list[tuple[tuple[str, str, str], int, bool, int]]:
    """(group key, row id, locked, covering row id) for every covered row (R-16)."""
    rows = probes.duplicated_rows(ctx.conn, ctx.agent_id)
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
    return [
        {
            "type": "duplicate_content",
            "groups": len({c[0] for c in covered}),
            "total_extra": len(covered),
            "repairable": sum(1 for c in covered if not c[2]),
        }
    ]


def repair_duplicates(ctx: Ctx, issues: list[Issue]) -> None:
    doomed = [(row_id, target) for _, row_id, locked, target in covered_rows(ctx) if not locked]
    for row_id, target in doomed:
        repoint_declarations(ctx, row_id, target)
    delete_unlocked(ctx, [row_id for row_id, _ in doomed])


DUPLICATE_CONTENT = Check("duplicate_content", "warn", detect_duplicates, repair_duplicates)

CHECKS = [MEMORY_ANNOTATION, DISCORD_MENTION, OVERSIZED_CONTENT, DUPLICATE_CONTENT]
