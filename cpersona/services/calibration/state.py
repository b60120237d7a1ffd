"""The live calibration values of this process, and the lookups recall makes on them.

One :class:`CalibrationState` per process is ``App.calibration``. It holds
what the sidecar file holds (:class:`SidecarValues`) plus which entries this
process changed since its last successful write, so a write merges with what
other processes put in the file instead of overwriting it (spec SC-6).

Readers (``threshold_for``, ``fused_gate_for``) take no lock for long and
never touch the disk: recall asks on every call.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from cpersona.services.calibration.sidecar import (
    AGENT_SECTIONS,
    Entry,
    SidecarValues,
    WriteResult,
    read_sidecar,
    scoring_version,
    write_sidecar,
)


class CalibrationState:
    """Thresholds, gates and betas in force, and what still has to reach the file."""

    def __init__(self, *, seed: int | None = None) -> None:
        self._lock = threading.RLock()
        self._values = SidecarValues()
        self._touched: set[Entry] = set()
        # One calibration at a time per process: each one reads the values the
        # previous one applied (old_threshold, the gate a β was measured with).
        self.run_lock = threading.Lock()
        # Random pairs and pseudo-queries come from here; a seed makes tests repeatable.
        self.rng = random.Random(seed)

    # -- reads (recall, precision) ------------------------------------------------

    def threshold_for(self, agent_id: str) -> float | None:
        """The agent's calibrated vector threshold, else the calibrated global one."""
        with self._lock:
            value = self._values.agent_thresholds.get(agent_id)
            return value if value is not None else self._values.global_threshold

    def global_threshold(self) -> float | None:
        with self._lock:
            return self._values.global_threshold

    def fused_gate_for(self, agent_id: str) -> tuple[float, str] | None:
        """(threshold, signal) of the agent's gate, else the global gate (spec GATE-3)."""
        with self._lock:
            signal = self._values.fused_gate_signal
            if not signal:
                return None
            value = self._values.agent_fused_gates.get(agent_id)
            if value is None:
                value = self._values.global_fused_gate
            return None if value is None else (value, signal)

    def agent_gate(self, agent_id: str) -> float | None:
        with self._lock:
            return self._values.agent_fused_gates.get(agent_id)

    def beta_override(self, agent_id: str) -> float | None:
        with self._lock:
            return self._values.agent_betas.get(agent_id)

    def embedding_dim(self) -> int | None:
        with self._lock:
            return self._values.embedding_dim

    def gate_signal(self) -> str | None:
        with self._lock:
            return self._values.fused_gate_signal

    def snapshot(self) -> SidecarValues:
        with self._lock:
            return self._values.copy()

    # -- changes --------------------------------------------------------------------

    def capture(self) -> dict[str, Any]:
        """What :meth:`rollback` needs to undo the changes that follow."""
        with self._lock:
            return {"values": self._values.copy(), "touched": set(self._touched)}

    def rollback(self, captured: dict[str, Any]) -> None:
        with self._lock:
            self._values = captured["values"]
            self._touched = captured["touched"]

    def apply(
        self,
        changes: dict[Entry, float | None],
        *,
        embedding_dim: int | None = None,
        embedding_model: str | None = None,
        gate_signal: str | None = None,
    ) -> None:
        """Put measured values in force; None removes an entry.

        A measurement on another vector width makes every measured value of
        the old width meaningless, so they go (betas stay: they are choices).
        A gate measured for another signal does the same to the other gates.
        """
        with self._lock:
            values = self._values
            if embedding_dim is not None and values.embedding_dim not in (None, embedding_dim):
                for entry in values.entries():
                    if entry[0] != "agent_betas":
                        values.put(entry, None)
                        self._touched.add(entry)
            if gate_signal is not None and values.fused_gate_signal not in (None, gate_signal):
                for agent in list(values.agent_fused_gates):
                    values.put(("agent_fused_gates", agent), None)
                    self._touched.add(("agent_fused_gates", agent))
                if values.global_fused_gate is not None:
                    values.put(("global_fused_gate", ""), None)
                    self._touched.add(("global_fused_gate", ""))
            if gate_signal is not None:
                values.fused_gate_signal = gate_signal
            if embedding_dim is not None:
                values.embedding_dim = embedding_dim
            if embedding_model is not None:
                values.embedding_model = embedding_model
            for entry, value in changes.items():
                values.put(entry, value)
                self._touched.add(entry)

    def restore(self, stored: SidecarValues, *, measured: bool) -> None:
        """Adopt a file read at start-up: every value when ``measured``, else only the betas (SC-5)."""
        with self._lock:
            if measured:
                mine = {entry: self._values.get(entry) for entry in self._touched}
                betas = {**stored.agent_betas, **self._values.agent_betas}
                self._values = stored.copy()
                self._values.agent_betas = betas
                for entry, value in mine.items():  # measured here since start-up: newer than the file
                    self._values.put(entry, value)
            else:
                for agent, beta in stored.agent_betas.items():
                    self._values.agent_betas.setdefault(agent, beta)

    def forget(self, agent_id: str) -> bool:
        """Drop every per-agent value of ``agent_id`` (delete_agent_data, spec DAD-2)."""
        with self._lock:
            found = False
            for section in AGENT_SECTIONS:
                entry = (section, agent_id)
                if self._values.get(entry) is not None:
                    found = True
                self._values.put(entry, None)
                self._touched.add(entry)
            return found

    def forget_agent(self, agent_id: str, settings: Any) -> bool:
        """Remove an agent's threshold, gate and β from memory and the sidecar (spec DAD-2, MG-7).

        For ``delete_agent_data`` and an emptying merge; True when the sidecar
        write succeeded (or had nothing to do).
        """
        with self.run_lock:
            had = self.forget(agent_id)
            stored = read_sidecar(settings.calibration_sidecar)
            on_disk = stored.values is not None and any(
                agent_id in table
                for table in (
                    stored.values.agent_thresholds,
                    stored.values.agent_fused_gates,
                    stored.values.agent_betas,
                )
            )
            if not had and not on_disk:
                return True
            return self.persist(settings).ok

    def persist(self, settings: Any) -> WriteResult:
        """Write this process's changes to the sidecar, merged with the file; adopt the result."""
        with self._lock:
            result = write_sidecar(
                settings.calibration_sidecar, self._values, set(self._touched), scoring_version(settings)
            )
            if result.ok and result.values is not None:
                # The merged file is now the truth: other processes' newer
                # entries come into force here too.
                self._values = result.values.copy()
                self._touched.clear()
            return result


def restore_preferences(app: Any) -> None:
    """Put the sidecar's per-agent betas (preferences, not measurements) in force.

    Done before the first call is served, whatever start-up work follows; it
    needs only the sidecar file, none of the measuring code.
    """
    stored = read_sidecar(app.settings.calibration_sidecar)
    if stored.values is not None:
        app.calibration.restore(stored.values, measured=False)
