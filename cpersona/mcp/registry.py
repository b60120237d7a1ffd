"""The tool table: each MCP tool is one :class:`ToolSpec`, and that declaration is the whole tool.

A declaration holds everything the server knows about a tool, in one place:

- what clients see: name, description, input schema, annotations, ``_meta``;
- ``request``: the dataclass its validated arguments are parsed into, once, by
  :mod:`cpersona.mcp.dispatch` (see :mod:`cpersona.services.requests`);
- ``project``: its axis of the operating context (``@auto`` resolution and the
  registry check, spec OC-7..OC-11), applied by dispatch, not by the service;
- ``access``: its ACL demand (:mod:`cpersona.mcp.demands`), derived from the
  annotations unless they do not say enough;
- ``paused``: what it does under a no-persist pause and the answer it then
  gives (:mod:`cpersona.mcp.pause_gate`), next to its success shape;
- ``refusal``: the shape of its ``ok: false`` answers (:meth:`ToolSpec.refuse`
  is the one place a refusal becomes an answer);
- ``contracts``: where its numbered contract points are specified;
- ``service``: the function that does the work, ``fn(app, request) -> dict``.

Services are named by :class:`Ref` (module and attribute) and imported on their
first call: building the table, which every start does, imports no service,
so a stdio start loads only what it runs (tests/test_startup.py).

Nothing else names a tool: adding one is adding one declaration to a module
under :mod:`cpersona.mcp.tools` (tests/test_registry.py walks the table).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cpersona.services.requests import Request, keyword_request
from cpersona.services.responses import ToolFailure, failure

if TYPE_CHECKING:
    from cpersona.mcp.demands import Access
    from cpersona.mcp.pause_gate import Rule
    from cpersona.services.app import App

# Builds the tool's own failure object (spec G-6: each tool refuses in the shape
# its callers branch on). It sees the raw arguments (store adds locked:false
# when lock was asked for).
Refusal = Callable[[str, Mapping[str, Any]], dict[str, Any]]


def error_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The common failure shape: ``{ok: false, error}``."""
    return failure(message)


@functools.cache
def _load(module: str, attr: str) -> Any:
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Ref:
    """A function named by its module and attribute, imported on its first call.

    The declarations name services and the rules that need a service this way,
    so that the table can be built and listed without importing them.
    """

    module: str
    attr: str

    def resolve(self) -> Any:
        return _load(self.module, self.attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class ServiceRef(Ref):
    """The service of a tool: ``fn(app, request) -> dict``, the request parsed once by dispatch."""

    def function(self) -> Callable[..., dict[str, Any]]:
        """The service as dispatch runs it: raising its refusals (see ``responses.answers_refusals``)."""
        fn = self.resolve()
        return getattr(fn, "raises", fn)

    def __call__(self, app: App, request: Request) -> dict[str, Any]:
        return self.function()(app, request)


ServiceFn = Callable[["App", Any], dict[str, Any]]


def by_keywords(fn: Callable[..., dict[str, Any]]) -> ServiceFn:
    """``fn(app, request)`` for a function written as ``fn(app, **arguments)`` (a tool built in place)."""

    @functools.wraps(fn)
    def call(app: App, request: Request) -> dict[str, Any]:
        return fn(app, **request.given())

    return call


@dataclass(frozen=True)
class Annotations:
    """MCP behaviour hints; ``None`` means the hint is left out of the declaration."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None

    def as_wire(self) -> dict[str, bool]:
        pairs = (
            ("readOnlyHint", self.read_only),
            ("destructiveHint", self.destructive),
            ("idempotentHint", self.idempotent),
        )
        return {key: value for key, value in pairs if value is not None}


READ_ONLY = Annotations(read_only=True)


@dataclass(frozen=True)
class ProjectAxis:
    """Whether, and how, the operating context's Hard layer applies to a tool's ``project_id``.

    ``writes``: a write may be refused by the registry (``enforce = "reject"``);
    a read is warned at most (spec AX-5).
    """

    name: str
    applies: bool
    writes: bool = False

    def resolve(self, app: App, project_id: Any, agent_id: Any) -> tuple[Any, dict[str, Any]]:
        """The project to use and the keys the answer gains (OC-11); raises ToolFailure when refused."""
        if not self.applies:
            return project_id, {}
        from cpersona.services.operating_context import ProjectRefusal, resolve_project

        resolution = resolve_project(app, project_id, agent_id=agent_id, writes=self.writes)
        if isinstance(resolution, ProjectRefusal):
            raise ToolFailure(resolution.message, **resolution.fields)
        return resolution.project_id, resolution.annotations


NO_PROJECT = ProjectAxis("none", applies=False)
READ_PROJECT = ProjectAxis("read", applies=True)
WRITE_PROJECT = ProjectAxis("write", applies=True, writes=True)


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
    """One MCP tool: its public declaration, its rules, and the service behind it."""

    name: str
    description: str | Callable[[], str] = _Lazy()  # type: ignore[assignment]
    input_schema: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = _Lazy()  # type: ignore[assignment]
    annotations: Annotations
    service: ServiceRef | ServiceFn
    contracts: str | None = None  # where its numbered contract points live in the specification (docs/tools.md)
    # None: a request carrying the schema's properties as sent (a keyword service's).
    request: type[Request] | Ref | None = None
    project: ProjectAxis = NO_PROJECT
    access: Access | None = None  # None: derived from the annotations (cpersona.mcp.demands.access_for)
    paused: Rule | None = None  # None: a read-only tool runs as usual (PassThrough); a write must say
    refusal: Refusal = error_refusal
    meta: Mapping[str, Any] | None = None
    # Checks on the raw arguments that come before the project axis and the
    # pause (store's ST-2 steps 1-2); raise ToolFailure to refuse.
    precheck: Callable[[Mapping[str, Any]], None] | None = None
    # Declared arguments this server does not carry out: a call that sets one
    # to anything but its default is refused, never silently ignored.
    unsupported: frozenset[str] = field(default_factory=frozenset)

    def resolved(self, field_name: str) -> bool:
        """Whether a lazily given field has been made already (reading it makes it)."""
        return not callable(self.__dict__[f"_{field_name}_source"])

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.input_schema.get("properties", {})

    def request_type(self) -> type[Request]:
        """The dataclass a call's validated arguments are parsed into."""
        if isinstance(self.request, Ref):
            return self.request.resolve()
        if self.request is not None:
            return self.request
        carried = tuple(p for p in self.properties if p not in self.unsupported)
        return keyword_request(self.name, carried)

    def refuse(self, refused: ToolFailure, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The one way a refusal becomes an answer: the tool's shape, plus what the refusal adds."""
        answer = {**self.refusal(refused.message, arguments), **refused.extra}
        if refused.key != "error" and refused.key not in answer:  # a refusal naming its own key keeps it
            answer.pop("error", None)
            answer[refused.key] = refused.message
        return answer


def request_fields(request: type[Request]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(request) if f.init)


def keyword_tool(*, service: Callable[..., dict[str, Any]], **declaration: Any) -> ToolSpec:
    """A declaration around a function object written with keyword arguments (see :func:`by_keywords`)."""
    return ToolSpec(service=by_keywords(service), **declaration)


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
        if spec.resolved("input_schema") and not isinstance(spec.request, Ref):
            carried = request_fields(spec.request_type()) | spec.unsupported
            if set(spec.properties) != carried:
                raise ValueError(
                    f"tool {spec.name!r}: its request carries {sorted(carried)}, "
                    f"its schema declares {sorted(spec.properties)}"
                )
        if spec.annotations.read_only is not True and spec.paused is None:
            raise ValueError(f"tool {spec.name!r} writes, so it must declare what it does while paused")
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
