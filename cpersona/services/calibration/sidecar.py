"""The calibration sidecar ``<db>.calibration.json``: reading, merging, writing (spec storage §7).

Calibration is measured, not configured, so it must survive restarts; it lives
beside the database rather than in it because several server processes may
share one database file and each measures for the configuration it runs.

- Reading (SC-4, SC-5): one JSON object. Keys an older release did not write
  read as absent; a value of the wrong type is dropped on its own (logged)
  rather than condemning the whole file. Whether the values apply is decided
  by the caller from ``embedding_dim`` and ``scoring_version``.
- Writing (SC-6): the whole object goes to ``<sidecar>.tmp.<pid>`` (0600),
  is flushed and renamed over the sidecar, under an exclusive ``flock`` on
  ``<sidecar>.lock``, so a crash mid-write leaves the previous file intact and
  two processes never interleave a read-merge-write.
- Merging: entries this process did not touch are carried over from the file
  (calibrating one agent never erases another's values, and another process's
  newer measurement is not overwritten by a stale copy held in memory); a file
  measured on another width or fingerprint is not carried, except for the
  per-agent betas, which are preferences rather than measurements.
- Backups (SC-7): a file that is about to be replaced without being carried
  (stale or unreadable) is copied aside first; if that copy fails, nothing is
  written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

# Our own fingerprint of the scoring function (SC-3). Scores differ from
# CPersona 2.6.14's (episode penalty on by default, a scale-aware floor for
# calibrated rrf gates), so a reference sidecar must never be restored onto ours.
SCORING_VERSION = "cpersona1-rrf-floor-scaled"
SIGNALS = ("confidence", "rsf", "rrf", "cosine")
MAX_SIDECAR_BYTES = 16 * 1024 * 1024  # far beyond any real file; a bigger one is not read
BACKUPS_KEPT = 5
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")

# An entry of the file: (section, agent). Sections naming one global value use agent ''.
Entry = tuple[str, str]
AGENT_SECTIONS = ("agent_thresholds", "agent_fused_gates", "agent_betas")
GLOBAL_SECTIONS = ("global_threshold", "global_fused_gate")


def scoring_version(settings: Any) -> str:
    """The live fingerprint: ours, plus the far-list weight when it changes fused scores."""
    weight = float(getattr(settings, "prior_far_weight", 1.0))
    return SCORING_VERSION if weight == 1.0 else f"{SCORING_VERSION}+far_weight={weight:g}"


@dataclass
class SidecarValues:
    """Everything the file holds (spec SC-2), in memory."""

    embedding_dim: int | None = None
    embedding_model: str = ""
    scoring_version: str | None = None
    global_threshold: float | None = None
    agent_thresholds: dict[str, float] = field(default_factory=dict)
    global_fused_gate: float | None = None
    agent_fused_gates: dict[str, float] = field(default_factory=dict)
    fused_gate_signal: str | None = None
    agent_betas: dict[str, float] = field(default_factory=dict)
    calibrated_at: str | None = None

    def copy(self) -> SidecarValues:
        return replace(
            self,
            agent_thresholds=dict(self.agent_thresholds),
            agent_fused_gates=dict(self.agent_fused_gates),
            agent_betas=dict(self.agent_betas),
        )

    def matches(self, embedding_dim: int | None, fingerprint: str) -> bool:
        """Whether measured values apply to a corpus of this width under this scoring (SC-5)."""
        return embedding_dim is not None and self.embedding_dim == embedding_dim and self.scoring_version == fingerprint

    def get(self, entry: Entry) -> float | None:
        section, agent = entry
        value = getattr(self, section)
        return value.get(agent) if isinstance(value, dict) else value

    def put(self, entry: Entry, value: float | None) -> None:
        section, agent = entry
        if section in AGENT_SECTIONS:
            table: dict[str, float] = getattr(self, section)
            if value is None:
                table.pop(agent, None)
            else:
                table[agent] = value
        else:
            setattr(self, section, value)

    def entries(self) -> set[Entry]:
        """Every entry holding a value."""
        found: set[Entry] = {(s, "") for s in GLOBAL_SECTIONS if getattr(self, s) is not None}
        for section in AGENT_SECTIONS:
            found.update((section, agent) for agent in getattr(self, section))
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "embedding_dim": self.embedding_dim,
            "embedding_model": self.embedding_model,
            "scoring_version": self.scoring_version,
            "global_threshold": self.global_threshold,
            "agent_thresholds": dict(self.agent_thresholds),
            "global_fused_gate": self.global_fused_gate,
            "agent_fused_gates": dict(self.agent_fused_gates),
            "fused_gate_signal": self.fused_gate_signal,
            "agent_betas": dict(self.agent_betas),
            "calibrated_at": self.calibrated_at,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SidecarValues:
        """Values from a parsed file; a missing key is absent (SC-4), a mistyped one dropped."""
        values = cls()
        dim = obj.get("embedding_dim")
        if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
            values.embedding_dim = dim
        elif dim is not None:
            log.warning("calibration sidecar: embedding_dim %r ignored", dim)
        model = obj.get("embedding_model")
        values.embedding_model = model if isinstance(model, str) else ""
        version = obj.get("scoring_version")
        values.scoring_version = version if isinstance(version, str) else None  # missing: stale (SC-3)
        values.global_threshold = _number(obj, "global_threshold", obj.get("global_threshold"), threshold=True)
        values.global_fused_gate = _number(obj, "global_fused_gate", obj.get("global_fused_gate"))
        values.agent_thresholds = _table(obj, "agent_thresholds", threshold=True)
        values.agent_fused_gates = _table(obj, "agent_fused_gates")
        values.agent_betas = {a: b for a, b in _table(obj, "agent_betas").items() if b > 0}
        signal = obj.get("fused_gate_signal")
        values.fused_gate_signal = signal if signal in SIGNALS else None
        stamp = obj.get("calibrated_at")
        values.calibrated_at = stamp if isinstance(stamp, str) else None
        return values


def _number(obj: Mapping[str, Any], where: str, value: Any, *, threshold: bool = False) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and threshold and not -1.0 <= value <= 1.0:
        ok = False  # a cosine threshold outside [-1, 1] cannot have been measured
    if not ok:
        log.warning("calibration sidecar: %s value %r ignored", where, value)
        return None
    return float(value)


def _table(obj: Mapping[str, Any], key: str, *, threshold: bool = False) -> dict[str, float]:
    raw = obj.get(key)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        log.warning("calibration sidecar: %s is not an object; ignored", key)
        return {}
    table: dict[str, float] = {}
    for agent, value in raw.items():
        number = _number(obj, f"{key}[{agent!r}]", value, threshold=threshold)
        if number is not None:
            table[agent] = number
    return table


@dataclass(frozen=True)
class SidecarRead:
    """What is on disk: nothing, a readable file, or bytes that are not a sidecar."""

    status: Literal["missing", "ok", "unreadable"]
    values: SidecarValues | None = None
    raw: bytes | None = None
    error: str | None = None


def read_sidecar(path: Path) -> SidecarRead:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SIDECAR_BYTES + 1)
    except FileNotFoundError:
        return SidecarRead("missing")
    except OSError as exc:
        return SidecarRead("unreadable", error=f"cannot read {path}: {exc.strerror or exc}")
    if len(raw) > MAX_SIDECAR_BYTES:
        return SidecarRead("unreadable", raw=raw, error=f"{path} is larger than {MAX_SIDECAR_BYTES} bytes")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return SidecarRead("unreadable", raw=raw, error=f"{path} is not JSON: {exc}")
    if not isinstance(obj, dict):
        return SidecarRead("unreadable", raw=raw, error=f"{path} does not hold a JSON object")
    return SidecarRead("ok", SidecarValues.from_json(obj), raw)


def merge(stored: SidecarRead, live: SidecarValues, touched: set[Entry], fingerprint: str) -> SidecarValues:
    """The object to write: ``live``'s header and touched entries over what the file may carry."""
    carried = stored.values if stored.status == "ok" else None
    if carried is not None and carried.matches(live.embedding_dim, fingerprint):
        result = carried.copy()
        for entry in touched:
            result.put(entry, live.get(entry))
        if live.fused_gate_signal and carried.fused_gate_signal != live.fused_gate_signal:
            # Gates measured for another signal mean nothing under ours.
            for agent in list(result.agent_fused_gates):
                if ("agent_fused_gates", agent) not in touched:
                    del result.agent_fused_gates[agent]
            if ("global_fused_gate", "") not in touched:
                result.global_fused_gate = None
        result.fused_gate_signal = live.fused_gate_signal or carried.fused_gate_signal
    else:
        result = live.copy()
        if carried is not None:  # stale measurements are not carried; preferences are (SC-5)
            for agent, beta in carried.agent_betas.items():
                if ("agent_betas", agent) not in touched:
                    result.agent_betas.setdefault(agent, beta)
    result.embedding_dim = live.embedding_dim
    result.embedding_model = live.embedding_model
    result.scoring_version = fingerprint
    result.calibrated_at = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    return result


@dataclass(frozen=True)
class WriteResult:
    ok: bool
    values: SidecarValues | None = None  # what the file now holds
    error: str | None = None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = Path(f"{path}.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_sidecar(path: Path, live: SidecarValues, touched: set[Entry], fingerprint: str) -> WriteResult:
    """Read, merge and replace the file atomically under the lock. Never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            stored = read_sidecar(path)
            if live.embedding_dim is None and stored.values is not None:
                # A process that measured nothing (say, one only forgetting an
                # agent) has no width of its own; it must not condemn the file.
                live = replace(live.copy(), embedding_dim=stored.values.embedding_dim)
            carried = stored.values is not None and stored.values.matches(live.embedding_dim, fingerprint)
            if stored.status != "missing" and not carried:
                backed_up = backup(path, stored)
                if not backed_up:
                    return WriteResult(
                        False, error=f"could not copy the previous {path.name} aside; it was left as it is"
                    )
            result = merge(stored, live, touched, fingerprint)
            _replace(path, json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8"))
            return WriteResult(True, result)
    except OSError as exc:
        log.warning("calibration sidecar %s not written: %s", path, exc)
        return WriteResult(False, error=f"could not write {path}: {exc.strerror or exc}")


def _replace(path: Path, data: bytes) -> None:
    tmp = Path(f"{path}.tmp.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the temp file may be left over from a crash with other bits
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # the only step that changes what readers see
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def backup_tag(stored: SidecarRead) -> str:
    """``<old scoring_version or 'unversioned'>``, or ``unreadable-<sha256[:12]>`` (SC-7)."""
    if stored.status != "ok" or stored.values is None:
        digest = hashlib.sha256(stored.raw or b"").hexdigest()[:12]
        return f"unreadable-{digest}"
    return _TAG_UNSAFE.sub("_", stored.values.scoring_version or "unversioned")


def backup(path: Path, stored: SidecarRead, *, now: datetime | None = None) -> bool:
    """Copy the file aside once per superseded version; keep the newest few. True when safe to replace."""
    tag = backup_tag(stored)
    prefix = f"{path.name}.before-"
    existing = sorted(p for p in path.parent.glob(f"{glob_escape(prefix)}*") if p.is_file())
    if any(p.name.startswith(f"{prefix}{tag}-") for p in existing):
        return True  # this version is already kept
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{prefix}{tag}-{stamp}")
    try:
        if stored.raw is not None:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(stored.raw)
        else:
            shutil.copyfile(path, target)
            os.chmod(target, 0o600)
    except OSError as exc:
        log.warning("calibration sidecar %s could not be backed up: %s", path, exc)
        return False
    log.info("calibration sidecar %s copied to %s before being replaced", path, target.name)
    kept = sorted([*existing, target], key=lambda p: (_mtime(p), p.name), reverse=True)
    for old in kept[BACKUPS_KEPT:]:
        with contextlib.suppress(OSError):
            old.unlink()
    return True


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
