"""Where export, import and backup may touch the file system (spec EX-1..EX-5, IM-1, decision 12).

Export and import take a server-side path from the caller, so a path is the
one argument that can reach outside the memory store. Every rule about such a
path is written once here and shared by export (``output_path``), import
(``input_path``), the ``cpersona export`` / ``backup`` commands and the ACL
gate:

- where a path may point (:func:`confinement`): inside ``CPERSONA_EXPORT_DIR``
  when it is set (EX-2); otherwise anywhere without a ``..`` segment (EX-3) —
  except for callers over streamable HTTP, who are not the machine's user and
  stay inside ``<database directory>/exports/``;
- what is never written over, nor read as an export (:class:`Guard`): the
  server's own files (database, ``-wal``/``-shm``/``-journal``, sidecars, ACL
  file, alias ledger, operating-context file), anything that is not a regular
  file, a symbolic link, and a regular file that is not itself a cpersona
  export. Files are compared by resolved path, by (directory, name) identity
  and by inode identity, so a second spelling, a symlinked parent or a hard
  link of the database are all the database;
- how an export reaches its destination (:func:`write_atomically`): a
  temporary file in the destination's directory, held open by descriptor, and
  the checks run again on that directory right before the rename.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cpersona.services.responses import ToolFailure

# Both separators count: a `..` hidden behind a backslash is still a climb on
# Windows, and refusing it on POSIX costs nothing.
_SEGMENTS = re.compile(r"[\\/]")
# The default root over streamable HTTP, under the database's directory.
EXPORTS_DIR_NAME = "exports"
EXPORT_PREFIX = "cpersona-export/"  # every export header's `version` starts so (storage.md §8)
_FIRST_LINE_LIMIT = 1 << 20  # a header is a few hundred bytes; more is not an export


# --- where a path may point ---------------------------------------------------------


@dataclass(frozen=True)
class Confinement:
    """The directory paths must stay inside, or None for any path (EX-3)."""

    root: Path | None
    # The HTTP default: relative names are taken inside the root (EX-2 takes
    # them from the working directory, which a remote caller cannot know).
    relative_to_root: bool = False


def confinement(app: Any) -> Confinement:
    configured = app.settings.export_dir
    if configured is not None:
        return Confinement(Path(configured))
    if getattr(app, "remote_callers", False):
        return Confinement(database_path(app).parent / EXPORTS_DIR_NAME, relative_to_root=True)
    return Confinement(None)


def database_path(app: Any) -> Path:
    opened = getattr(app.db, "path", None)
    return Path(opened) if opened is not None else app.settings.db_file


def confine(raw: object, export_dir: Path | None, argument: str, *, relative_to_root: bool = False) -> Path:
    """The path the tool may use for ``raw``, or a ToolFailure naming ``argument``.

    With ``export_dir`` set the fully resolved path (symlinks followed, relative
    paths taken from the working directory, or from ``export_dir`` itself when
    ``relative_to_root``) must be that directory or lie inside it, and the
    resolved path is what gets used (EX-2). Without it any path is allowed
    unless one of its segments is exactly ``..`` (EX-3).
    """
    message = f"{argument} rejected (path traversal or outside export dir): {raw}"
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise ToolFailure(message)  # EX-1
    if export_dir is None:
        if ".." in _SEGMENTS.split(raw):
            raise ToolFailure(message)
        return Path(raw)
    root = Path(os.path.realpath(os.path.expanduser(export_dir)))
    given = os.path.join(root, raw) if relative_to_root else raw
    resolved = Path(os.path.realpath(given))
    if resolved != root and root not in resolved.parents:
        if relative_to_root:
            message += (
                f" — over streamable HTTP, export and import stay inside {root} unless "
                "CPERSONA_EXPORT_DIR names another directory"
            )
        raise ToolFailure(message)
    return resolved


def confined_path(app: Any, raw: object, argument: str) -> Path:
    rule = confinement(app)
    return confine(raw, rule.root, argument, relative_to_root=rule.relative_to_root)


# --- what is never written over -------------------------------------------------------


def protected_files(app: Any) -> list[tuple[Path, str]]:
    """(path, what it is) for every file the server itself keeps."""
    s = app.settings
    files: list[tuple[Path, str]] = []
    for db in dict.fromkeys((database_path(app), s.db_file)):
        files += [
            (db, "the memory database"),
            (Path(f"{db}-wal"), "the database's write-ahead log"),
            (Path(f"{db}-shm"), "the database's shared-memory index"),
            (Path(f"{db}-journal"), "the database's rollback journal"),
        ]
        files += [
            (Path(f"{db}.{name}"), "a vector index sidecar")
            for name in (
                "memories.vecindex",
                "episodes.vecindex",
                "memories.coarseindex",
                "episodes.coarseindex",
                "blocks.blockindex",
            )
        ]
    sidecar = s.calibration_sidecar
    files += [(sidecar, "the calibration sidecar"), (Path(f"{sidecar}.lock"), "the calibration sidecar's lock")]
    files += [(Path(p), "a calibration sidecar backup") for p in glob.glob(glob.escape(str(sidecar)) + ".before-*")]
    files += [
        (s.update_check_cache, "the update-check cache"),
        (s.alias_ledger_path, "the alias ledger"),
        (s.operating_context_path, "the operating-context file"),
    ]
    if s.acl_file is not None:
        files.append((s.acl_file, "the ACL file"))
    return files


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class Guard:
    """The server's own files as they are now: by resolved path, (directory, name) and inode."""

    def __init__(self, files: list[tuple[Path, str]]) -> None:
        self.paths: dict[str, str] = {}
        self.names: dict[tuple[int, int, str], str] = {}
        self.inodes: dict[tuple[int, int], str] = {}
        for raw, what in files:
            path = os.path.abspath(os.path.expanduser(raw))
            for spelling in (path, os.path.realpath(path)):
                self.paths.setdefault(spelling, what)
                with suppress(OSError):
                    parent = os.stat(os.path.dirname(spelling))
                    self.names.setdefault((parent.st_dev, parent.st_ino, os.path.basename(spelling)), what)
            with suppress(OSError):
                info = os.stat(path)
                self.inodes.setdefault((info.st_dev, info.st_ino), what)

    @classmethod
    def of(cls, app: Any) -> Guard:
        return cls(protected_files(app))

    def by_path(self, path: Path) -> str | None:
        absolute = os.path.abspath(path)
        return self.paths.get(absolute) or self.paths.get(os.path.realpath(absolute))

    def by_inode(self, info: os.stat_result) -> str | None:
        return self.inodes.get((info.st_dev, info.st_ino))

    def check_entry(self, dir_fd: int, name: str, shown: Path, argument: str) -> None:
        """Refuse unless ``name`` in the open directory may be replaced by an export."""
        folder = os.fstat(dir_fd)
        what = self.names.get((folder.st_dev, folder.st_ino, name))
        if what:
            raise _never_written(argument, shown, what)
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise ToolFailure(
                f"{argument} refused: {shown} is a symbolic link, which is never written through; name the file itself"
            )
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailure(
                f"{argument} refused: {shown} is {file_kind(info.st_mode)}, not a regular file, so nothing was written"
            )
        what = self.by_inode(info)
        if what:
            raise _never_written(argument, shown, what)
        if not is_export_header(first_record(name, dir_fd=dir_fd)):
            raise ToolFailure(
                f"{argument} refused: {shown} already exists and is not a cpersona export, so it "
                "was not replaced; choose a new file name"
            )

    def check_target(self, path: Path, argument: str) -> None:
        """The same checks before anything is written (the directory may not exist yet)."""
        what = self.by_path(path)
        if what:
            raise _never_written(argument, path, what)
        folder = os.path.dirname(os.path.abspath(path))
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # nothing exists there yet
        except NotADirectoryError:
            raise ToolFailure(f"{argument} refused: {folder} is not a directory") from None
        try:
            self.check_entry(dir_fd, os.path.basename(os.path.abspath(path)), path, argument)
        finally:
            os.close(dir_fd)


def _never_written(argument: str, path: Path, what: str) -> ToolFailure:
    return ToolFailure(f"{argument} refused: {path} is {what}, which is never written over; choose another file")


def open_regular(path: str | Path, *, dir_fd: int | None = None) -> IO[bytes] | None:
    """``path`` opened for reading when it is a regular file, else None.

    Opened without blocking, then judged by the descriptor: opening a FIFO
    would otherwise wait for a writer forever, and a file swapped after a
    check is judged as what was actually opened. OSError propagates.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def first_record(path: str | Path, *, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The first line of a regular file as a JSON object, or None."""
    try:
        handle = open_regular(path, dir_fd=dir_fd)
        if handle is None:
            return None
        with handle:
            line = handle.readline(_FIRST_LINE_LIMIT)
        value = json.loads(line.decode("utf-8").removeprefix("\ufeff"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def is_export_header(record: dict[str, Any] | None) -> bool:
    """Whether ``record`` (a file's first line) is the header of a cpersona export."""
    version = record.get("version") if record else None
    return (
        bool(record)
        and record.get("_type") == "header"
        and isinstance(version, str)
        and (version.startswith(EXPORT_PREFIX))
    )


# --- export: the destination and the write --------------------------------------------


def output_target(app: Any, raw: object) -> Path:
    """Where ``export_memories`` may write ``raw``, after every refusal judged before writing."""
    path = confined_path(app, raw, "output_path")
    try:
        Guard.of(app).check_target(path, "output_path")
    except OSError as exc:
        raise ToolFailure(f"could not write {path}: {exc.strerror or exc}") from None
    return path


def new_file_target(app: Any, raw: Path, argument: str) -> Path:
    """A destination that must not exist yet (``cpersona backup``), refused when it is the server's own."""
    path = Path(os.path.abspath(os.path.expanduser(raw)))
    what = Guard.of(app).by_path(path)
    if what:
        raise _never_written(argument, path, what)
    if os.path.lexists(path):
        kind = " (a symbolic link)" if os.path.islink(path) else ""
        raise ToolFailure(f"{argument} refused: {path} already exists{kind}; choose a new file name")
    return path


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and each missing ancestor with mode 0700 (EX-5).

    ``mkdir(parents=True)`` would give the ancestors the default mode.
    """
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


@contextmanager
def write_atomically(app: Any, path: Path) -> Iterator[IO[str]]:
    """A text file that appears at ``path`` only if the block completes (EX-5).

    The temporary file is created in the destination's directory through a
    descriptor held on that directory, and renamed within it, so swapping a
    parent for a symlink mid-export cannot move the write elsewhere; the
    destination is checked once more right before the rename.
    """
    absolute = Path(os.path.abspath(path))
    make_private_dirs(absolute.parent)
    dir_fd = os.open(absolute.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    temp = f".{absolute.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            Guard.of(app).check_entry(dir_fd, absolute.name, path, "output_path")
            os.replace(temp, absolute.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


# --- import: the source ---------------------------------------------------------------


def vet_input_file(app: Any, raw: object) -> Path:
    """Everything IM-1 checks before an import reads a byte of content.

    Exposed on its own because the MCP facade must run it before the pause
    gate (IM-2): a paused import still reports a bad path.
    """
    max_bytes = app.settings.max_import_bytes
    path = confined_path(app, raw, "input_path")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ToolFailure(f"File not found: {path}") from None
    except OSError as exc:
        raise ToolFailure(f"could not read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"input_path is not a regular file: {path}")
    guard = Guard.of(app)
    what = guard.by_inode(info) or guard.by_path(path)
    if what:
        raise ToolFailure(f"input_path refused: {path} is {what}, not an export; import reads only export files")
    if info.st_size > max_bytes:
        raise ToolFailure(f"input file exceeds CPERSONA_MAX_IMPORT_BYTES ({max_bytes}): {path}")
    return path
