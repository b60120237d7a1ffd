"""The ``cpersona-export/1.1`` file format: records out, lines in (spec storage.md §8).

Export side: one function per record type turns a database row into the dict
that becomes one line. Import side: the file is read as a stream of
``\\n``-separated lines (never whole), each decoded, stripped and parsed, so a
100 MB file costs one line of memory at a time. The header's counts are checked
here too (JL-4, IM-10).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpersona.services.portability.coerce import encode_vector, parse_json_column
from cpersona.services.portability.graph import RefMap
from cpersona.services.portability.paths import is_export_header, open_regular
from cpersona.services.responses import ToolFailure

VERSION = "cpersona-export/1.1"

# Record types this server restores, and those it reads only to count them.
RECORD_TYPES = ("memory", "episode", "profile")
GRAPH_TYPES = ("entity", "mention", "relation")
FOLDER_TYPES = ("folder", "folder_member")
KNOWN_TYPES = frozenset(("header",) + RECORD_TYPES + GRAPH_TYPES + FOLDER_TYPES)

# Header count key for each record type (JL-4).
COUNT_KEYS = {
    "memory": "memory_count",
    "episode": "episode_count",
    "profile": "profile_count",
    "entity": "entity_count",
    "mention": "mention_count",
    "relation": "relation_count",
    "folder": "folder_count",
    "folder_member": "folder_member_count",
}


def dump_line(record: dict[str, Any]) -> str:
    """One line of the file: default separators, non-ASCII unescaped, ``\\n``-terminated (JL-1)."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


# --- export: rows to records ----------------------------------------------


def header_record(agent_id: str, exported_at: str, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "_type": "header",
        "version": VERSION,
        "agent_id": agent_id,
        "exported_at": exported_at,
        "memory_count": counts["memory"],
        "episode_count": counts["episode"],
        "has_profile": counts["profile"] > 0,
        "profile_count": counts["profile"],
        "entity_count": counts["entity"],
        "mention_count": counts["mention"],
        "relation_count": counts["relation"],
    }


def _with_vector(record: dict[str, Any], row: Any, include_embeddings: bool) -> dict[str, Any]:
    # JL-6: only on request and only for rows that have a vector; the label
    # travels with it ("" where this database keeps no labels).
    if include_embeddings and row.embedding:
        record["embedding_b64"] = encode_vector(bytes(row.embedding))
        record["embedding_model"] = getattr(row, "embedding_model", "") or ""
    return record


def memory_record(row: Any, include_embeddings: bool) -> dict[str, Any]:
    source, source_text = parse_json_column(row.source)
    metadata, metadata_text = parse_json_column(row.metadata)
    record: dict[str, Any] = {
        "_type": "memory",
        "id": row.id,
        "agent_id": row.agent_id,
        "msg_id": row.msg_id,
        "content": row.content,
        "source": source,
        "timestamp": row.timestamp,
        "metadata": metadata,
        "created_at": row.created_at,
        "project_id": row.project_id,
        "channel": row.channel,
        "locked": 1 if row.locked else 0,
        "recall_count": row.recall_count,
        "last_recalled_at": row.last_recalled_at,
    }
    # EX-8: a column that is not JSON travels verbatim beside an empty object.
    if source_text is not None:
        record["source_text"] = source_text
    if metadata_text is not None:
        record["metadata_text"] = metadata_text
    return _with_vector(record, row, include_embeddings)


def episode_record(row: Any, include_embeddings: bool) -> dict[str, Any]:
    record: dict[str, Any] = {
        "_type": "episode",
        "id": row.id,
        "agent_id": row.agent_id,
        "summary": row.summary,
        "keywords": row.keywords,
        "start_time": row.start_time,
        "end_time": row.end_time,
        "created_at": row.created_at,
        "resolved": bool(row.resolved),
        "project_id": row.project_id,
        "channel": row.channel,
    }
    return _with_vector(record, row, include_embeddings)


def profile_record(row: Any) -> dict[str, Any]:
    return {
        "_type": "profile",
        "agent_id": row.agent_id,
        "user_id": row.user_id,
        "content": row.content,
        "updated_at": row.updated_at,
        "project_id": row.project_id,
    }


# --- import: lines to records -----------------------------------------------


@dataclass(frozen=True)
class Line:
    """One non-blank line: its 1-based number and either a record or an error text."""

    number: int
    record: dict[str, Any] | None
    error: str | None = None


def read_lines(path: Path, max_bytes: int) -> Iterator[Line]:
    """Stream the file's records; never holds more than one line in memory.

    Splits on ``\\n`` only (U+2028/U+2029 are legal inside JSON strings, JL-1).
    Reads at most ``max_bytes + 1`` bytes, so a file that grew after vetting is
    still refused (IM-1). Undecodable UTF-8 and OS errors raise ToolFailure.
    """
    consumed = 0
    try:
        # Opened without blocking and checked again: a FIFO swapped in after vetting must not hang us.
        handle = open_regular(path)
        if handle is None:
            raise ToolFailure(f"input_path is not a regular file: {path}")
        with handle:
            for number, raw in enumerate(handle, start=1):
                consumed += len(raw)
                if consumed > max_bytes:
                    raise ToolFailure(f"input file exceeds CPERSONA_MAX_IMPORT_BYTES ({max_bytes}): {path}")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ToolFailure(f"could not read {path}: line {number}: {exc}") from None
                if number == 1:
                    text = text.removeprefix("\ufeff")  # a BOM is an editor's, not data
                text = text.strip()
                if not text:
                    continue
                yield _parse(number, text)
    except OSError as exc:
        raise ToolFailure(f"could not read {path}: {exc.strerror or exc}") from None


def _parse(number: int, text: str) -> Line:
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer longer than int() converts
        return Line(number, None, f"Line {number}: invalid JSON: {exc}")
    except RecursionError:
        return Line(number, None, f"Line {number}: invalid JSON: nested too deeply")
    if not isinstance(value, dict):
        return Line(number, None, f"Line {number}: not a JSON object")
    return Line(number, value)


def record_type(record: dict[str, Any]) -> str:
    """The record's ``_type`` as text ("" when absent: such lines are ignored, IM-3)."""
    kind = record.get("_type")
    if kind is None or kind == "":
        return ""
    return kind if isinstance(kind, str) else json.dumps(kind)


@dataclass
class FileScan:
    """What a first pass over the file learned, before anything is written."""

    header: dict[str, Any] | None = None
    counts: Counter[str] = field(default_factory=Counter)
    parse_errors: list[str] = field(default_factory=list)
    # Knows which record ids the graph records point at: the only ids worth
    # remembering while records are restored (keeps a 100 MB import flat).
    refs: RefMap = field(default_factory=RefMap)

    @property
    def export_headed(self) -> bool:
        return is_export_header(self.header)

    @property
    def has_graph(self) -> bool:
        return any(self.counts[kind] for kind in GRAPH_TYPES)

    def truncation(self) -> str | None:
        """IM-10: the header's counts against what the file holds; None when they agree."""
        if self.header is None:
            return None
        mismatched = [
            kind
            for kind, key in COUNT_KEYS.items()
            if key in self.header and not _same_count(self.header[key], self.counts[kind])
        ]
        if not mismatched:
            return None
        groups = [("memory", "episode", "profile"), GRAPH_TYPES, FOLDER_TYPES]
        parts = [_declares(self.header, self.counts, groups[0])]
        parts += [_declares(self.header, self.counts, g) for g in groups[1:] if set(g) & set(mismatched)]
        return "file truncated or inconsistent: " + "; ".join(parts)


def _same_count(declared: Any, found: int) -> bool:
    return type(declared) is int and declared == found


_PLURAL = {
    "memory": "memories",
    "episode": "episodes",
    "profile": "profiles",
    "entity": "entities",
    "mention": "mentions",
    "relation": "relations",
    "folder": "folders",
    "folder_member": "folder members",
}


def _declares(header: dict[str, Any], counts: Counter[str], kinds: tuple[str, ...]) -> str:
    declared = " / ".join(f"{header.get(COUNT_KEYS[k], '?')} {_PLURAL[k]}" for k in kinds)
    found = " / ".join(str(counts[k]) for k in kinds)
    return f"header declares {declared}, file contains {found}"


def scan(path: Path, max_bytes: int) -> FileScan:
    """First pass: header, per-type counts, parse errors and the refs graph records use."""
    result = FileScan()
    for line in read_lines(path, max_bytes):
        if line.record is None:
            result.parse_errors.append(line.error or "")
            continue
        kind = record_type(line.record)
        if kind == "header":
            if result.header is None:
                result.header = line.record
            continue
        if kind in KNOWN_TYPES:
            result.counts[kind] += 1
        if kind in ("mention", "relation"):
            result.refs.want_from(line.record)
    return result
