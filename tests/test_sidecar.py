"""The calibration sidecar on disk: format, atomic write, lock and merge, validity, backups (spec storage §7)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest

from cpersona.services.calibration import sidecar as sc
from cpersona.services.calibration.sidecar import (
    SCORING_VERSION,
    SidecarValues,
    read_sidecar,
    scoring_version,
    write_sidecar,
)
from cpersona.services.calibration.state import CalibrationState

REFERENCE_FILE = {  # a sidecar as CPersona 2.6.14 writes it (spec SC-2 example)
    "embedding_dim": 64, "embedding_model": "text-embedding-3-small",
    "scoring_version": "260a7-confidence-gates-nothing", "global_threshold": 0.5953,
    "agent_thresholds": {"rc": 0.573}, "global_fused_gate": None, "agent_fused_gates": {},
    "fused_gate_signal": None, "agent_betas": {"rc": 2.0}, "calibrated_at": "2026-11-30T04:15:55.888799+00:00",
}  # fmt: skip


class FakeSettings:
    """Only what the sidecar reads: where the file is and the far-list weight."""

    def __init__(self, path: Path, prior_far_weight: float = 1.0) -> None:
        self.calibration_sidecar = path
        self.prior_far_weight = prior_far_weight


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "mem" / "cpersona.db.calibration.json"


def ours(**values) -> SidecarValues:
    return SidecarValues(embedding_dim=64, scoring_version=SCORING_VERSION, **values)


def put(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


# -- SC-1, SC-2: where and what --------------------------------------------------------------


def test_path_is_the_database_path_with_the_suffix(make_settings_path) -> None:
    # spec SC-1, FS-2
    settings, db_file = make_settings_path
    assert settings.calibration_sidecar == Path(f"{db_file}.calibration.json")


@pytest.fixture
def make_settings_path(tmp_path: Path):
    from cpersona.config import load_settings

    db_file = tmp_path / "x" / "m.db"
    return load_settings({"CPERSONA_DB_PATH": str(db_file)}), db_file


def test_written_file_has_every_key_in_order_on_one_line_0600(path: Path) -> None:
    # spec SC-2, SC-6
    live = ours(global_threshold=0.31, fused_gate_signal="rsf")
    live.agent_thresholds["a"] = 0.42
    live.agent_fused_gates["a"] = 0.17
    live.agent_betas["a"] = 2.0
    result = write_sidecar(path, live, live.entries(), SCORING_VERSION)
    assert result.ok
    raw = path.read_text()
    assert "\n" not in raw  # written without indentation
    obj = json.loads(raw)
    assert list(obj) == [
        "embedding_dim",
        "embedding_model",
        "scoring_version",
        "global_threshold",
        "agent_thresholds",
        "global_fused_gate",
        "agent_fused_gates",
        "fused_gate_signal",
        "agent_betas",
        "calibrated_at",
    ]
    assert obj["agent_thresholds"] == {"a": 0.42} and obj["agent_fused_gates"] == {"a": 0.17}
    assert obj["fused_gate_signal"] == "rsf" and obj["agent_betas"] == {"a": 2.0}
    stamp = datetime.fromisoformat(obj["calibrated_at"])
    assert stamp.tzinfo == timezone.utc and obj["calibrated_at"].endswith("+00:00") and "." in obj["calibrated_at"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Path(f"{path}.lock").exists()  # spec FS-3
    assert not list(path.parent.glob("*.tmp.*"))  # the temporary file was renamed, not left behind


def test_reference_file_reads_back_every_value(path: Path) -> None:
    # spec SC-2: the reference's own example parses to the same values
    put(path, REFERENCE_FILE)
    read = read_sidecar(path)
    assert read.status == "ok"
    v = read.values
    assert (v.embedding_dim, v.scoring_version, v.global_threshold) == (64, "260a7-confidence-gates-nothing", 0.5953)
    assert v.agent_thresholds == {"rc": 0.573} and v.agent_betas == {"rc": 2.0} and v.fused_gate_signal is None


# -- SC-3, SC-4, SC-5: fingerprint, older shapes, validity -----------------------------------


def test_our_fingerprint_is_not_the_reference_one_and_tracks_the_far_weight(path: Path) -> None:
    # spec SC-3: our scores differ (rrf gate floor, episode penalty default), so ours must differ
    assert scoring_version(FakeSettings(path)) == SCORING_VERSION != "260a7-confidence-gates-nothing"
    assert scoring_version(FakeSettings(path, 0.5)) == f"{SCORING_VERSION}+far_weight=0.5"
    put(path, REFERENCE_FILE)
    assert not read_sidecar(path).values.matches(64, SCORING_VERSION)  # a reference file is stale here


def test_older_shapes_read_missing_keys_as_absent(path: Path) -> None:
    # spec SC-4: before 2.4.26 no gate keys, before 2.4.29 no agent_betas; before 2.5.2 no scoring_version
    put(path, {"embedding_dim": 64, "global_threshold": 0.4, "agent_thresholds": {"a": 0.5}})
    v = read_sidecar(path).values
    assert v.agent_fused_gates == {} and v.global_fused_gate is None and v.fused_gate_signal is None
    assert v.agent_betas == {} and v.agent_thresholds == {"a": 0.5}
    assert v.scoring_version is None and not v.matches(64, SCORING_VERSION)  # SC-3: unversioned is stale


def test_validity_needs_both_the_width_and_the_fingerprint(path: Path) -> None:
    # spec SC-5
    v = ours()
    assert v.matches(64, SCORING_VERSION)
    assert not v.matches(32, SCORING_VERSION)
    assert not v.matches(None, SCORING_VERSION)  # no live vectors: nothing can be judged valid
    assert not v.matches(64, "260a7-confidence-gates-nothing")


def test_a_mistyped_value_is_dropped_alone(path: Path) -> None:
    put(
        path,
        {
            "embedding_dim": 64,
            "scoring_version": SCORING_VERSION,
            "agent_thresholds": {"a": "high", "b": 0.4, "c": 7.0, "d": True},
            "agent_betas": {"a": -1, "b": 2.0},
            "fused_gate_signal": "bogus",
            "global_threshold": "x",
        },
    )
    read = read_sidecar(path)
    assert read.status == "ok"
    assert read.values.agent_thresholds == {"b": 0.4}  # a threshold outside [-1, 1] cannot be a cosine
    assert read.values.agent_betas == {"b": 2.0}
    assert read.values.fused_gate_signal is None and read.values.global_threshold is None


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\xff\xfe"])
def test_unreadable_files_are_reported_as_such(path: Path, content: str) -> None:
    put(path, content)
    read = read_sidecar(path)
    assert read.status == "unreadable" and read.values is None and read.error


# -- SC-6: atomic write, lock, merge -----------------------------------------------------------


def test_a_crash_mid_write_leaves_the_previous_file_whole(path: Path, monkeypatch) -> None:
    # spec SC-6: the data goes to a temporary file first; the rename is the only visible step
    first = ours(global_threshold=0.3)
    assert write_sidecar(path, first, first.entries(), SCORING_VERSION).ok
    before = path.read_bytes()
    real_write = os.write

    def half_then_die(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sc.os, "write", half_then_die)
    second = ours(global_threshold=0.9)
    result = write_sidecar(path, second, second.entries(), SCORING_VERSION)
    monkeypatch.undo()
    assert not result.ok and "No space left" in result.error
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.tmp.*"))


def test_merge_keeps_what_this_process_did_not_measure(path: Path) -> None:
    # spec SC-6: calibrating one agent never erases another's values
    settings = FakeSettings(path)
    one, two = CalibrationState(), CalibrationState()  # two processes sharing the file
    one.apply({("agent_thresholds", "a"): 0.4, ("agent_betas", "a"): 2.0}, embedding_dim=64)
    assert one.persist(settings).ok
    two.apply({("agent_thresholds", "b"): 0.5}, embedding_dim=64)
    assert two.persist(settings).ok
    obj = json.loads(path.read_text())
    assert obj["agent_thresholds"] == {"a": 0.4, "b": 0.5} and obj["agent_betas"] == {"a": 2.0}
    # After its write, process two has the other process's entries in force as well.
    assert two.threshold_for("a") == 0.4 and two.beta_override("a") == 2.0


def test_a_newer_value_from_another_process_is_not_overwritten_by_a_stale_copy(path: Path) -> None:
    settings = FakeSettings(path)
    one, two = CalibrationState(), CalibrationState()
    one.apply({("agent_thresholds", "x"): 0.3}, embedding_dim=64)
    one.persist(settings)
    two.restore(read_sidecar(path).values, measured=True)
    one.apply({("agent_thresholds", "x"): 0.6}, embedding_dim=64)  # one measures x again
    one.persist(settings)
    two.apply({("agent_thresholds", "y"): 0.2}, embedding_dim=64)  # two still holds x = 0.3
    two.persist(settings)
    assert json.loads(path.read_text())["agent_thresholds"] == {"x": 0.6, "y": 0.2}
    assert two.threshold_for("x") == 0.6


def test_removed_entries_are_dropped_and_others_kept(path: Path) -> None:
    # spec SC-6 ("entries it removed are dropped"), DAD-2
    settings = FakeSettings(path)
    one = CalibrationState()
    one.apply(
        {
            ("agent_thresholds", "a"): 0.4,
            ("agent_fused_gates", "a"): 0.2,
            ("agent_betas", "a"): 2.0,
            ("agent_thresholds", "b"): 0.5,
        },
        embedding_dim=64,
        gate_signal="rsf",
    )
    one.persist(settings)
    other = CalibrationState()  # a process that never read the file forgets agent a
    assert other.forget("a") is False
    assert other.persist(settings).ok
    obj = json.loads(path.read_text())
    assert obj["agent_thresholds"] == {"b": 0.5} and obj["agent_fused_gates"] == {} and obj["agent_betas"] == {}
    assert obj["embedding_dim"] == 64  # a process with no width of its own keeps the file's


def test_gates_of_another_signal_are_not_carried(path: Path) -> None:
    # spec GATE-3: a gate is only ever compared against rows of its own signal
    settings = FakeSettings(path)
    rrf_process, rsf_process = CalibrationState(), CalibrationState()
    rrf_process.apply({("agent_fused_gates", "a"): 0.015}, embedding_dim=64, gate_signal="rrf")
    rrf_process.persist(settings)
    rsf_process.apply({("agent_fused_gates", "b"): 0.17}, embedding_dim=64, gate_signal="rsf")
    rsf_process.persist(settings)
    obj = json.loads(path.read_text())
    assert obj["fused_gate_signal"] == "rsf" and obj["agent_fused_gates"] == {"b": 0.17}


def _hammer(path_text: str, agent_prefix: str, rounds: int) -> None:
    settings = FakeSettings(Path(path_text))
    state = CalibrationState()
    for i in range(rounds):
        state.apply({("agent_thresholds", f"{agent_prefix}{i}"): 0.3}, embedding_dim=64)
        assert state.persist(settings).ok


def test_two_processes_writing_at_once_lose_nothing(path: Path) -> None:
    # spec SC-6: the read-merge-write cycle holds an exclusive lock on <sidecar>.lock
    path.parent.mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_hammer, args=(str(path), prefix, 25)) for prefix in ("p", "q", "r")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    agents = json.loads(path.read_text())["agent_thresholds"]
    assert len(agents) == 75 and {a[0] for a in agents} == {"p", "q", "r"}


# -- SC-5 on write, SC-7 backups ---------------------------------------------------------------


def test_a_stale_file_is_backed_up_once_per_version_and_its_betas_kept(path: Path) -> None:
    # spec SC-5, SC-7
    put(path, REFERENCE_FILE)
    live = ours(global_threshold=0.44)
    assert write_sidecar(path, live, live.entries(), SCORING_VERSION).ok
    backups = sorted(path.parent.glob(f"{path.name}.before-*"))
    assert [b.name.rsplit("-", 2)[0] for b in backups] == [f"{path.name}.before-260a7-confidence-gates-nothing"]
    assert json.loads(backups[0].read_text()) == REFERENCE_FILE
    assert stat.S_IMODE(backups[0].stat().st_mode) == 0o600
    obj = json.loads(path.read_text())
    assert obj["agent_thresholds"] == {} and obj["global_threshold"] == 0.44  # measurements not carried
    assert obj["agent_betas"] == {"rc": 2.0}  # preferences are
    put(path, REFERENCE_FILE)  # the same old version again: no second copy
    assert write_sidecar(path, live, live.entries(), SCORING_VERSION).ok
    assert len(list(path.parent.glob(f"{path.name}.before-*"))) == 1


def test_an_unreadable_file_is_copied_aside_with_its_digest(path: Path) -> None:
    # spec SC-7
    put(path, "{truncated")
    live = ours(global_threshold=0.4)
    assert write_sidecar(path, live, live.entries(), SCORING_VERSION).ok
    import hashlib

    digest = hashlib.sha256(b"{truncated").hexdigest()[:12]
    backups = list(path.parent.glob(f"{path.name}.before-unreadable-{digest}-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == b"{truncated"


def test_an_unreadable_file_that_cannot_be_copied_is_never_overwritten(path: Path, monkeypatch) -> None:
    # spec SC-7
    put(path, "{truncated")
    real_open = os.open

    def no_backups(name, flags, mode=0o777, **kw):
        if ".before-" in os.fspath(name):
            raise OSError(30, "Read-only file system")
        return real_open(name, flags, mode, **kw)

    monkeypatch.setattr(sc.os, "open", no_backups)
    live = ours(global_threshold=0.4)
    result = write_sidecar(path, live, live.entries(), SCORING_VERSION)
    monkeypatch.undo()
    assert not result.ok and "left as it is" in result.error
    assert path.read_text() == "{truncated"


def test_only_the_newest_five_backups_are_kept(path: Path) -> None:
    # spec SC-7, FS-3 (at most 5 sidecar backups)
    for i in range(7):
        put(path, {**REFERENCE_FILE, "scoring_version": f"old-{i}"})
        live = ours(global_threshold=0.4)
        assert write_sidecar(path, live, live.entries(), SCORING_VERSION).ok
        for backup in path.parent.glob(f"{path.name}.before-old-{i}-*"):
            os.utime(backup, (1_700_000_000 + i, 1_700_000_000 + i))  # distinct ages, oldest first
    kept = sorted(b.name.split(".before-")[1].rsplit("-", 2)[0] for b in path.parent.glob(f"{path.name}.before-*"))
    assert kept == ["old-2", "old-3", "old-4", "old-5", "old-6"]
