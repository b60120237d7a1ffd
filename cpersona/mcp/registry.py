"""The tool table: what each MCP tool is called, what it accepts, and which service runs it.

A tool is data (:class:`ToolSpec`); the single call path that runs any of them
lives in :mod:`cpersona.mcp.dispatch`. Adding a tool means adding one
declaration to a module under :mod:`cpersona.mcp.tools` — nothing else changes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cpersona.services.responses import failure

ServiceFn = Callable[..., dict[str, Any]]
# Builds the tool's own failure object for a refusal that happens before the
# service runs (spec G-6: each tool refuses in the shape its callers branch on).
# It sees the raw arguments (store adds locked:false when lock was asked for).
Refusal = Callable[[str, Mapping[str, Any]], dict[str, Any]]


def error_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The common failure shape: ``{ok: false, error}``."""
    return failure(message)


@dataclass(frozen=True)
class Annotations:
    """MCP behaviour hints; ``None`` means the hint is left out of the declaration."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None

    def as_wire(self) -> dict[str, bool]:
        pairs = (("readOnlyHint", self.read_only), ("destructiveHint", self.destructive),
                 ("idempotentHint", self.idempotent))
        return {key: value for key, value in pairs if value is not None}


READ_ONLY = Annotations(read_only=True)


@functools.cache
def _import_service(path: str) -> ServiceFn:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@functools.cache
def _keyword_parameters(fn: ServiceFn) -> frozenset[str] | None:
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first one is the App
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


class _Lazy:
    """A field holding its value, or a function that makes it on first read.

    A description or schema rendered from a service's own tables (the health
    registry's size and names) would otherwise import that service when the
    tool table is built, which every start does; read, it is always the value.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}_source"

    def __get__(self, spec: Any, owner: type | None = None) -> Any:
        if spec is None:
            raise AttributeError("no default")  # a required dataclass field
        value = spec.__dict__[self._slot]
        if callable(value):
            value = value()
            spec.__dict__[self._slot] = value
        return value

    def __set__(self, spec: Any, value: Any) -> None:
        spec.__dict__[self._slot] = value


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: its public declaration and the service function behind it.

    ``service`` is a ``"module:function"`` path, imported on first use so that a
    tool table can be built (and listed) without importing every service; a
    function object is taken as is.
    """

    name: str
    description: str | Callable[[], str] = _Lazy()  # type: ignore[assignment]
    input_schema: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = _Lazy()  # type: ignore[assignment]
    annotations: Annotations
    service: str | ServiceFn
    refusal: Refusal = error_refusal
    meta: Mapping[str, Any] | None = None

    def resolved(self, field_name: str) -> bool:
        """Whether a lazily given field has been made already (reading it makes it)."""
        return not callable(self.__dict__[f"_{field_name}_source"])

    def service_function(self) -> ServiceFn:
        return self.service if callable(self.service) else _import_service(self.service)

    def accepted_arguments(self) -> frozenset[str] | None:
        """Argument names the service takes, or None when it takes any (``**kwargs``)."""
        return _keyword_parameters(self.service_function())

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.input_schema.get("properties", {})


class Registry:
    """The tools a server offers, in declaration order (the order ``tools/list`` shows)."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ToolSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is declared twice")
        if spec.resolved("input_schema") and spec.input_schema.get("type") != "object":
            raise ValueError(f"tool {spec.name!r}: the input schema must describe an object")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return list(self._specs)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs
