"""Where export and import may touch the file system (spec EX-1..EX-4, IM-1).

Both tools take a server-side path from the caller, so a path is the one
argument that can reach outside the memory store. The confinement rule is
written once here and shared by export (``output_path``) and import
(``input_path``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from cpersona.services.responses import ToolFailure

# Both separators count: a `..` hidden behind a backslash is still a climb on
# Windows, and refusing it on POSIX costs nothing.
_SEGMENTS = re.compile(r"[\\/]")


def confine(raw: object, export_dir: Path | None, argument: str) -> Path:
    """The path the tool may use for ``raw``, or a ToolFailure naming ``argument``.

    With ``export_dir`` set the fully resolved path (symlinks followed, relative
    paths taken from the working directory) must be that directory or lie inside
    it, and the resolved path is what gets used (EX-2). Without it any path is
    allowed unless one of its segments is exactly ``..`` (EX-3).
    """
    rejected = ToolFailure(
        f"{argument} rejected (path traversal or outside export dir): {raw}"
    )
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise rejected  # EX-1
    if export_dir is None:
        if ".." in _SEGMENTS.split(raw):
            raise rejected
        return Path(raw)
    root = Path(os.path.realpath(os.path.expanduser(export_dir)))
    resolved = Path(os.path.realpath(raw))
    if resolved != root and root not in resolved.parents:
        raise rejected
    return resolved


def vet_input_file(raw: object, export_dir: Path | None, max_bytes: int) -> Path:
    """Everything IM-1 checks before an import reads a byte of content.

    Exposed on its own because the MCP facade must run it before the pause
    gate (IM-2): a paused import still reports a bad path.
    """
    path = confine(raw, export_dir, "input_path")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ToolFailure(f"File not found: {path}") from None
    except OSError as exc:
        raise ToolFailure(f"could not read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"input_path is not a regular file: {path}")
    if info.st_size > max_bytes:
        raise ToolFailure(
            f"input file exceeds CPERSONA_MAX_IMPORT_BYTES ({max_bytes}): {path}"
        )
    return path
