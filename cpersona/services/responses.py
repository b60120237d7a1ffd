"""Response shapes shared by every tool: how success and failure look on the wire.

One rule lives here (spec G-1): a failure carries ``ok: false`` and a
human-readable explanation. Most tools put it in ``error``; ``store`` and
``update_profile`` put it in ``reason``. Services raise :class:`ToolFailure`
(or return :func:`failure`) instead of building these dicts by hand.

A service raises its refusals and never catches them to answer: the MCP
dispatch turns a :class:`ToolFailure` into the tool's own refusal shape. A
service that is also a library function (tests, the CLI) is wrapped once in
:func:`answers_refusals`, the one place a refusal becomes a library caller's
answer; dispatch calls the function underneath (``raises``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class ToolFailure(Exception):
    """A refusal the caller should see as ``{ok: false, <key>: message, **extra}``."""

    def __init__(self, message: str, *, key: str = "error", **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.extra = extra

    def as_response(self) -> dict[str, Any]:
        return failure(self.message, key=self.key, **self.extra)


def failure(message: str, *, key: str = "error", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False}
    out.update(extra)
    out[key] = message
    return out


def answers_refusals(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``fn`` for a library caller: a refusal it raises is returned as its ``ok: false`` answer.

    The wrapped function stays reachable as ``raises``, which is what a tool's
    declaration runs, so that dispatch answers the refusal in the tool's shape.
    """

    @functools.wraps(fn)
    def answered(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return fn(*args, **kwargs)
        except ToolFailure as refused:
            return refused.as_response()

    answered.raises = fn  # type: ignore[attr-defined]
    return answered
