"""The base of every tool request: a tool's arguments, parsed once, in the types its schema promises.

The MCP layer validates a call against the tool's JSON Schema and keeps only the
declared keys; it then builds the tool's request with :meth:`Request.from_arguments`
and hands it to the service as ``fn(app, request)``. A service therefore reads
typed fields and never re-checks their types. What remains for the service is
meaning (a limit clamped to a setting, a time cue parsed into a period), not
shape.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, ClassVar, Self


class _Omitted:
    """An argument the caller did not send (distinct from an explicit null)."""

    _instance: ClassVar[_Omitted | None] = None

    def __new__(cls) -> _Omitted:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OMITTED"

    def __bool__(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class Request:
    """A tool's arguments; subclasses declare one field per schema property."""

    OMITTED: ClassVar[_Omitted] = _Omitted()

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> Self:
        """The request for validated arguments; a field the caller left out keeps its default."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{key: value for key, value in arguments.items() if key in names})

    def given(self) -> dict[str, Any]:
        """The fields the caller sent (those still at OMITTED left out)."""
        return {
            f.name: value for f in dataclasses.fields(self) if (value := getattr(self, f.name)) is not Request.OMITTED
        }


@functools.cache
def keyword_request(name: str, properties: tuple[str, ...]) -> type[Request]:
    """A request carrying ``properties`` as sent, for a service still written with keyword arguments."""
    fields = [(prop, Any, dataclasses.field(default=Request.OMITTED)) for prop in properties]
    return dataclasses.make_dataclass(f"{name}_request", fields, bases=(Request,), frozen=True)
