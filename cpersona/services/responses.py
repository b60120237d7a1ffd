"""Response shapes shared by every tool: how success and failure look on the wire.

One rule lives here (spec G-1): a failure carries ``ok: false`` and a
human-readable explanation. Most tools put it in ``error``; ``store`` and
``update_profile`` put it in ``reason``. Services raise :class:`ToolFailure`
(or return :func:`failure`) instead of building these dicts by hand.
"""

from __future__ import annotations

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
