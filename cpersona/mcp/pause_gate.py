"""The no-persist pause gate: what every tool does while its caller's bucket is paused.

Each tool's declaration names its behaviour (``ToolSpec.paused``), one of these
(spec admin-and-safety §9.5, G-7):

- :class:`Skip` — a write tool answers a no-op shaped like its success: any
  ``id`` becomes ``"no-persist"``, the action id keys become null, and
  ``persisted: false``, ``dry_run: true`` and a ``reason`` with the TTL left are
  added. Some tools check part of their input first (store's boundary, import's
  file vetting, merge's arguments, and the operating context's project check
  for tools with a write project axis), and import and merge still run a dry run.
- :class:`ForceDryRun` — ``migrate_channel_axis`` runs, as a dry run.
- :class:`DowngradeFix` — ``check_health`` / ``deep_check`` run with ``fix=false``.
- :class:`PassThrough` — reads, export, check_update and the pause tools run
  normally.

Whatever runs while its bucket is paused receives an App marked
``writes_paused``, so a read skips its incidental writes (recall counters, P-12).

A read-only tool that declares nothing passes through. The registry refuses a
write tool that declares nothing; a write built outside it is skipped with a
bare no-op here — a write nobody classified is never let through during a pause.
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

    The declaration's ``precheck`` and then ``before`` run the checks the spec
    places ahead of the pause and raise :class:`ToolFailure` to refuse (answered
    in the tool's own refusal shape); then the operating context's project
    check runs when the tool has a project axis (the same one dispatch applies);
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
            return call.spec.refuse(refusal, call.arguments)

    def _answer(self, call: ToolCall, state: PauseState) -> Response:
        if call.spec.precheck is not None:
            call.spec.precheck(call.arguments)
        if self.before is not None:
            self.before(call.app, call.arguments)
        # The operating context's Hard layer also precedes the pause: a write its
        # registry refuses is refused, and '@auto' is still reported (OC-11).
        _, notes = call.spec.project.resolve(
            call.app, call.arguments.get("project_id"), call.arguments.get("agent_id", "")
        )
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
            answer = {
                **answer,
                "repairs_skipped": True,
                "repairs_skip_reason": "no-persist mode active — dry_run forced",
            }
        return answer


@dataclass(frozen=True)
class DowngradeFix(Rule):
    """P-11: a health run reports but does not repair."""

    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        if call.arguments.get("fix") is not True:
            return await call_next(call)
        answer = await call_next(call.with_arguments({**call.arguments, "fix": False}))
        if isinstance(answer, dict):
            answer = {
                **answer,
                "fixed": False,
                "repairs_skipped": True,
                "repairs_skip_reason": "no-persist mode active — fix downgraded to fix=False",
            }
        return answer


@dataclass(frozen=True)
class PassThrough(Rule):
    async def paused(self, call: ToolCall, call_next: CallNext, state: PauseState) -> Response:
        return await call_next(call)


def const(body: Response) -> Callable[[App, Arguments], Response]:
    """A paused body that does not depend on the call."""
    return lambda _app, _args: dict(body)


class PauseGate:
    """The gate (see :mod:`cpersona.mcp.gates`) that applies each tool's declared pause behaviour."""

    def rule_for(self, call: ToolCall) -> Rule:
        rule = call.spec.paused
        if rule is not None:
            return rule
        if call.spec.annotations.read_only is True:
            return PassThrough()
        log.warning("tool %s has no pause rule; skipping it while paused", call.spec.name)
        return Skip(const({"ok": True}))

    async def __call__(self, call: ToolCall, call_next: CallNext) -> Response:
        # Cheap: a dict look-up under a lock, no I/O.
        state = pause_state(call.app, call.arguments.get("session_key", ""))
        if not state.paused:
            return await call_next(call)
        quiet = dataclasses.replace(call, app=dataclasses.replace(call.app, writes_paused=True))
        return await self.rule_for(call).paused(quiet, call_next, state)
