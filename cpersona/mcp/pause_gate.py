"""The no-persist pause gate: what every tool does while its caller's bucket is paused.

One gate, one table. :data:`PAUSE_RULES` names, for every tool the pause
concerns, one of these behaviours (spec admin-and-safety §9.5, G-7):

- :class:`Skip` — a write tool answers a no-op shaped like its success: any
  ``id`` becomes ``"no-persist"``, the action id keys become null, and
  ``persisted: false``, ``dry_run: true`` and a ``reason`` with the TTL left are
  added. Some tools check part of their input first (store's boundary, import's
  file vetting, merge's arguments, the operating context's project check for
  the writes it governs), and import and merge still run a dry run.
- :class:`ForceDryRun` — ``migrate_channel_axis`` runs, as a dry run.
- :class:`DowngradeFix` — ``check_health`` / ``deep_check`` run with ``fix=false``.
- :class:`PassThrough` — reads, export, check_update and the pause tools run
  normally.

Whatever runs while its bucket is paused receives an App marked
``writes_paused``, so a read skips its incidental writes (recall counters, P-12).

A tool with no rule is treated by its annotations: a read-only tool passes
through, any other tool is skipped with a bare no-op — a write nobody classified
is never let through during a pause. The test suite fails when a registered
write tool has no rule, so that fallback is a safety net, not the design.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from cpersona.mcp.gates import CallNext, Response, ToolCall
from cpersona.services.app import App
from cpersona.services.operating_context import WRITE_TOOLS as OPERATING_CONTEXT_WRITES
from cpersona.services.operating_context import ProjectRefusal, resolve_project
from cpersona.services.operations.pause import PauseState, pause_state, skip_reason
from cpersona.services.responses import ToolFailure

log = logging.getLogger(__name__)

NO_PERSIST = "no-persist"
# Keys naming the row a write acted on: null in a skipped answer (§9.5).
ACTION_ID_KEYS = ("deleted_id", "updated_id", "locked_id", "unlocked_id", "episode_id")

Arguments = Mapping[str, Any]


def skipped(tool: str, body: Response, state: PauseState) -> Response:
    """A tool's success body turned into its paused no-op (§9.5)."""
    answer = dict(body)
    if "id" in answer:
        answer["id"] = NO_PERSIST
    for key in ACTION_ID_KEYS:
        if key in answer:
            answer[key] = None
    answer.update(persisted=False, dry_run=True, reason=skip_reason(tool, state))
    return answer


class Rule(ABC):
    @abstractmethod
    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        """How a call is answered while its pause bucket is paused."""


@dataclass(frozen=True)
class Skip(Rule):
    """A write answered by a no-op while paused.

    ``before`` runs the checks the spec places ahead of the pause and raises
    :class:`ToolFailure` to refuse (answered in the tool's own refusal shape);
    then the operating context's project check runs for the writes it governs;
    then ``body`` builds the tool's success shape, which may also refuse (a
    body computed from validated arguments). ``unless_dry_run`` lets a caller's
    own dry run through, since it writes nothing; ``after`` adds keys that
    follow the three pause keys. The checks may read files or state, so they
    run in a worker thread.
    """

    body: Callable[[App, Arguments], Response]
    before: Callable[[App, Arguments], None] | None = None
    unless_dry_run: bool = False
    after: Callable[[Arguments], Response] | None = None

    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        if self.unless_dry_run and call.arguments.get("dry_run") is True:
            return await call_next(call)
        try:
            return await anyio.to_thread.run_sync(self._answer, call, state)
        except ToolFailure as refusal:
            return {**call.spec.refusal(refusal.message, call.arguments), **refusal.extra}

    def _answer(self, call: ToolCall, state: PauseState) -> Response:
        if self.before is not None:
            self.before(call.app, call.arguments)
        notes: Response = {}
        if call.spec.name in OPERATING_CONTEXT_WRITES:
            # The operating context's Hard layer also precedes the pause: a write its
            # registry refuses is refused, and '@auto' is still reported (OC-11).
            resolution = resolve_project(call.app, call.spec.name, call.arguments.get("project_id"),
                                         agent_id=call.arguments.get("agent_id", ""))
            if isinstance(resolution, ProjectRefusal):
                raise ToolFailure(resolution.message, **resolution.fields)
            notes = resolution.annotations
        answer = skipped(call.spec.name, self.body(call.app, call.arguments), state)
        answer.update(notes)
        if self.after is not None:
            answer.update(self.after(call.arguments))
        return answer


@dataclass(frozen=True)
class ForceDryRun(Rule):
    """P-11: ``migrate_channel_axis`` reports what it would do and changes nothing."""

    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        asked_to_write = call.arguments.get("dry_run") is False  # its default is a dry run
        answer = await call_next(call.with_arguments({**call.arguments, "dry_run": True}))
        if asked_to_write and isinstance(answer, dict):
            answer = {**answer, "repairs_skipped": True,
                      "repairs_skip_reason": "no-persist mode active — dry_run forced"}
        return answer


@dataclass(frozen=True)
class DowngradeFix(Rule):
    """P-11: a health run reports but does not repair."""

    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        if call.arguments.get("fix") is not True:
            return await call_next(call)
        answer = await call_next(call.with_arguments({**call.arguments, "fix": False}))
        if isinstance(answer, dict):
            answer = {**answer, "fixed": False, "repairs_skipped": True,
                      "repairs_skip_reason": "no-persist mode active — fix downgraded to fix=False"}
        return answer


@dataclass(frozen=True)
class PassThrough(Rule):
    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        return await call_next(call)


# -- what some writes check before a pause answers them, and the bodies that need the service ------


def store_boundary(app: App, args: Arguments) -> None:
    """ST-2: mixed forms and a missing agent are refused even while paused.

    Mirrors the first two steps of ``services.memories`` validation (same
    messages, same order); tests/test_pause.py holds the two to each other.
    """
    from cpersona.services.records.memories import MISSING_AGENT, MIXED_FORMS

    message = args.get("message")
    if isinstance(message, dict) and message:
        top_level_used = (
            args.get("content") not in (None, "") or args.get("id") not in (None, "")
            or args.get("timestamp") not in (None, "") or bool(args.get("metadata")) or "source" in args
        )
        if top_level_used:
            raise ToolFailure(MIXED_FORMS)
    if args.get("agent_id") is None:
        raise ToolFailure(MISSING_AGENT)


def _store_lock_flag(args: Arguments) -> Response:
    # ST-12: a store that asked for a lock says it did not get one.
    return {"locked": False} if args.get("lock") is True else {}


# The portability and calibration services are imported by the rules that use
# them, on the first paused call of their tool: a server start loads neither.


def _vet_import(app: App, args: Arguments) -> None:
    from cpersona.services import portability

    portability.vet_import(app, args.get("input_path"))  # IM-1 before IM-2


def _merge_arguments(args: Arguments) -> tuple[Any, Any, Any, Any]:
    return (args.get("source_agent_id"), args.get("target_agent_id"),
            args.get("strategy", "skip"), args.get("mode", "copy"))


def _validate_merge(app: App, args: Arguments) -> None:
    from cpersona.services import portability

    portability.validate_merge(*_merge_arguments(args))  # MG-1 before MG-2


def _calibration_body(app: App, args: Arguments) -> Response:
    """The success shape with everything a measurement would compute left empty (§9.5)."""
    from cpersona.services.calibration import service as calibration

    req = calibration.parse_arguments(app, args.get("agent_id"), args.get("sample_size"), args.get("z_factor"),
                                      args.get("method"), args.get("percentile"))
    return {
        "ok": True, "sidecar_persisted": False, "scope": "per_agent" if req.agent_id else "global",
        "agent_id": req.agent_id, "sampled_embeddings": 0, "num_pairs": 0, "method": req.method,
        "z_factor": req.z_factor, "percentile": req.percentile, "embedding_dim": None,
        "embedding_model": calibration.embedding_model_label(app.settings), "distribution": None,
        "null_admit_rate": None, "old_threshold": calibration.current_threshold(app, req.agent_id),
        "new_threshold": None,
    }


def _precision_body(app: App, args: Arguments) -> Response:
    """The resolved setting, with nothing recalibrated (§9.5: after argument resolution)."""
    from cpersona.services.calibration import precision

    agent = precision._agent(args.get("agent_id"))
    label, beta, cleared = precision.resolve(app, args.get("precision", ""), args.get("beta", 0))
    return {"ok": True, "agent_id": agent, "precision": label, "beta": beta, "cleared": cleared,
            "fused_gate": None, "calibrate": None}


def _paused_import_body(app: App, args: Arguments) -> Response:
    from cpersona.services import portability

    return portability.paused_import_body()


def _paused_merge_body(app: App, args: Arguments) -> Response:
    from cpersona.services import portability

    return portability.paused_merge_body(*_merge_arguments(args))


def _const(body: Response) -> Callable[[App, Arguments], Response]:
    return lambda _app, _args: dict(body)


# -- the table ------------------------------------------------------------------------------

PAUSE_RULES: Mapping[str, Rule] = {
    # Writes that answer a no-op (§9.5 table).
    "store": Skip(_const({"ok": True, "result": "skipped", "id": NO_PERSIST, "embedded": False}),
                  before=store_boundary, after=_store_lock_flag),
    "declare_associations": Skip(_const({"ok": True, "result": "skipped", "entities": [], "mentions": 0,
                                         "relations": [], "dropped": []})),
    "archive_episode": Skip(_const({"ok": True, "queued": False, "task_id": None, "episode_id": None,
                                    "id": NO_PERSIST})),
    "update_memory": Skip(_const({"ok": True, "updated_id": None})),
    "delete_memory": Skip(_const({"ok": True, "deleted_id": None})),
    "delete_episode": Skip(_const({"ok": True, "deleted_id": None})),
    "lock_memory": Skip(_const({"ok": True, "locked_id": None})),
    "unlock_memory": Skip(_const({"ok": True, "unlocked_id": None})),
    "delete_agent_data": Skip(lambda _app, args: {  # DAD-5: before the empty-id check
        "ok": True, "agent_id": args.get("agent_id", ""), "deleted_memories": 0, "deleted_profiles": 0,
        "deleted_episodes": 0, "deleted_pending_tasks": 0}),
    "update_profile": Skip(_const({"ok": True, "profiles_updated": 0})),
    "import_memories": Skip(_paused_import_body, before=_vet_import,
                            unless_dry_run=True),
    "merge_memories": Skip(_paused_merge_body,
                           before=_validate_merge, unless_dry_run=True),
    "calibrate_threshold": Skip(_calibration_body),
    "set_recall_precision": Skip(_precision_body),
    "organize_folders": Skip(_const({"ok": True, "applied": [], "dropped": []})),
    # Writes that still run, harmlessly (P-11).
    "migrate_channel_axis": ForceDryRun(),
    "check_health": DowngradeFix(),
    "deep_check": DowngradeFix(),
    # Unaffected (P-12): export writes a file, not a record; check_update installs
    # software; the pause tools manage the pause itself.
    "export_memories": PassThrough(),
    "check_update": PassThrough(),
    "pause_persistence": PassThrough(),
    "resume_persistence": PassThrough(),
}


class PauseGate:
    """The gate (see :mod:`cpersona.mcp.gates`) that applies :data:`PAUSE_RULES`."""

    def __init__(self, rules: Mapping[str, Rule] = PAUSE_RULES) -> None:
        self.rules = rules

    def rule_for(self, call: ToolCall) -> Rule:
        rule = self.rules.get(call.spec.name)
        if rule is not None:
            return rule
        if call.spec.annotations.read_only is True:
            return PassThrough()
        log.warning("tool %s has no pause rule; skipping it while paused", call.spec.name)
        return Skip(_const({"ok": True}))

    async def __call__(self, call: ToolCall, call_next: CallNext) -> Response:
        # Cheap: a dict look-up under a lock, no I/O.
        state = pause_state(call.app, call.arguments.get("session_key", ""))
        if not state.paused:
            return await call_next(call)
        quiet = dataclasses.replace(call, app=dataclasses.replace(call.app, writes_paused=True))
        return await self.rule_for(call).paused(quiet, call_next, state)
