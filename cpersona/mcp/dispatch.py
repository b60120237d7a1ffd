"""The one call path every tool takes, from raw arguments to the service's answer.

    look up the tool            unknown name       → error
    walk the arguments          bound crossed      → input validation error
                                lone surrogate     → the tool's own refusal (G-6)
                                NUL character      → the tool's own refusal (decision 11)
    validate against schema     violation          → input validation error (G-3)
    keep declared keys                              (G-5)
    refuse what is not carried  a declared argument this server does not carry out,
                                set to anything but its default → the tool's own refusal
    gate chain                  a gate may answer instead of the service
    off the event loop:
      parse the request         the tool's request dataclass, once (ToolSpec.request)
      project axis              '@auto' and the registry (OC-7..OC-11) → project_id replaced,
                                notes added to the answer; a refused write → the tool's refusal
      run the service           ToolSpec.service(app, request)
                                ToolFailure        → the tool's refusal shape (not an MCP error)
                                storage failure    → one sentence, the tool's own refusal
                                (busy past the lock wait, read-only, disk full; cpersona.storage.errors)
                                any other crash    → logged, error (G-4)

Nothing here knows the MCP SDK: the result is an :class:`Outcome`, which
:mod:`cpersona.mcp.results` turns into a ``CallToolResult``.
"""

from __future__ import annotations

import logging
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from cpersona.mcp.gates import GateChain, Response, ToolCall
from cpersona.mcp.registry import Registry, ToolSpec
from cpersona.mcp.validation import conform, inspect_arguments, schema_violation
from cpersona.services.app import App
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, failure
from cpersona.storage import errors as storage_errors

log = logging.getLogger(__name__)

INPUT_ERROR_PREFIX = "Input validation error: "


@dataclass(frozen=True)
class Outcome:
    """A tool's answer and whether it is an MCP-level error (``isError``)."""

    payload: dict[str, Any]
    is_error: bool = False


def input_error(detail: str) -> Outcome:
    # The reference answers the bare string "Input validation error: ..."; every
    # answer of ours is a JSON object with ok:false, so the same words go in `error`.
    return Outcome(failure(INPUT_ERROR_PREFIX + detail), is_error=True)


async def call_tool(
    app: App,
    registry: Registry,
    gates: GateChain,
    name: str,
    arguments: Mapping[str, Any] | None,
    context: Mapping[str, Any] | None = None,
) -> Outcome:
    spec = registry.get(name)
    if spec is None:
        return Outcome(failure(f"Unknown tool: {name}"), is_error=True)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return input_error(f"arguments must be an object, not {type(arguments).__name__}")

    report = inspect_arguments(arguments)
    if report.bound_crossed:
        return input_error(report.bound_crossed)
    if report.lone_surrogate_at:
        return Outcome(
            spec.refusal(
                f"{report.lone_surrogate_at} contains a lone UTF-16 surrogate, which is not valid text; nothing was done",
                arguments,
            )
        )
    if report.nul:
        return Outcome(spec.refusal(f"{report.nul}, which text cannot hold; nothing was done", arguments))
    violation = schema_violation(spec.input_schema, arguments)
    if violation:
        return input_error(violation)
    declared = conform(spec.input_schema, arguments)

    if (unsupported := _unsupported(spec, declared)) is not None:
        return Outcome(spec.refusal(f"{unsupported} is not supported by this server yet; nothing was done", arguments))
    try:
        payload = await gates.run(ToolCall(app, spec, declared, dict(context or {})), _run_service)
        if not isinstance(payload, dict):
            raise TypeError(f"service for {spec.name} returned {type(payload).__name__}, not a dict")
    except ToolFailure as refusal:
        return Outcome(spec.refuse(refusal, declared))
    except Exception as exc:  # noqa: BLE001 — G-4: one bad call must never stop the server
        return _crashed(app, spec, name, declared, exc)
    return Outcome(payload)


def _crashed(app: App, spec: ToolSpec, name: str, arguments: Mapping[str, Any], exc: Exception) -> Outcome:
    """The answer to a service that raised; a storage failure is one sentence in the tool's own shape.

    SQLAlchemy's text carries the statement and its parameters (the caller's
    content): neither reaches the answer, nor stderr at the default log level.
    """
    if storage_errors.is_storage_failure(exc):
        label = app.db.label
        storage_errors.log_details(log, f"tool {name}", exc)
        known = storage_errors.sentence(exc, label)
        if known is not None:
            if not isinstance(exc, storage_errors.ReadOnlyDatabase):  # that one was announced at start-up
                log.warning("tool %s: %s", name, known)
            return Outcome(spec.refusal(known, arguments))
        message = storage_errors.reason(exc, label)
        log.error("tool %s failed: %s: %s", name, type(exc).__name__, message)
        return Outcome(failure(f"{type(exc).__name__}: {message}"), is_error=True)
    log.exception("tool %s failed", name)
    return Outcome(failure(f"{type(exc).__name__}: {exc}"), is_error=True)


def _unsupported(spec: ToolSpec, arguments: Mapping[str, Any]) -> str | None:
    """The first declared argument the server does not carry out that the call sets, if any.

    Our schemas match the reference's so clients see the same surface; a
    feature not built must say so, not behave as if the argument were absent.
    An argument left at its declared default is harmless.
    """
    for key in spec.unsupported:
        if key in arguments and arguments[key] != spec.properties[key].get("default"):
            return key
    return None


def serve(app: App, spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the request, apply the project axis, run the service: one call, in a worker thread."""
    if spec.precheck is not None:
        spec.precheck(arguments)
    request: Request = spec.request_type().from_arguments(arguments)
    notes: dict[str, Any] = {}
    if spec.project.applies:
        project_id, notes = spec.project.resolve(app, request.project_id, request.agent_id)  # type: ignore[attr-defined]
        request = dataclasses.replace(request, project_id=project_id)  # type: ignore[type-var]
    answer = spec.service(app, request)
    if notes and isinstance(answer, dict) and answer.get("ok") is not False:
        answer.update(notes)  # OC-11: '@auto' is echoed, a registry miss warned
    return answer


async def _run_service(call: ToolCall) -> Response:
    # Services are blocking (SQLite, HTTP embeddings); the event loop keeps
    # serving other requests while one runs in a worker thread. Read-only tools
    # and writers draw on separate threads, so queued writers never stall a read.
    return await call.app.db.run(
        partial(serve, call.app, call.spec, call.arguments), writes=call.spec.annotations.read_only is not True
    )
