"""The gate chain: checks that stand between a validated call and its service.

Every tool call passes through the same ordered list of gates after its
arguments are validated and before its service function runs. A gate sees the
call and either answers it itself (a refusal, or a no-op such as a paused
write) or hands it, possibly amended, to the next gate with ``call_next``.
The last step of the chain runs the service.

Two gates run here, in this order: the ACL check (transport-and-config §4,
:class:`cpersona.mcp.acl.AclGate`, present when a policy is loaded) and the
no-persist pause (spec G-7, :class:`cpersona.mcp.pause_gate.PauseGate`), so
that "who may call what, and which calls may write" is decided in this one
place for every tool and transport.
What each gate decides for a tool is read from the tool's declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cpersona.mcp.registry import ToolSpec
from cpersona.services.app import App

Response = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One validated call on its way to a service.

    ``context`` carries per-request facts a transport knows and a gate may need
    (later: the ACL principal, the HTTP session); it never reaches the service.
    """

    app: App
    spec: ToolSpec
    arguments: Mapping[str, Any]
    context: Mapping[str, Any] = field(default_factory=dict)

    def with_arguments(self, arguments: Mapping[str, Any]) -> ToolCall:
        return dataclasses.replace(self, arguments=dict(arguments))


CallNext = Callable[[ToolCall], Awaitable[Response]]


class Gate(Protocol):
    async def __call__(self, call: ToolCall, call_next: CallNext) -> Response: ...


class GateChain:
    """Gates applied in order, outermost first; the last ``call_next`` is the service."""

    def __init__(self, gates: Iterable[Gate] = ()) -> None:
        self.gates: tuple[Gate, ...] = tuple(gates)

    async def run(self, call: ToolCall, final: CallNext) -> Response:
        async def step(index: int, current: ToolCall) -> Response:
            if index == len(self.gates):
                return await final(current)
            return await self.gates[index](current, lambda amended: step(index + 1, amended))

        return await step(0, call)
