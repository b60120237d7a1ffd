"""The operator's operating context: one TOML file of rules every client is told (spec admin-and-safety §10).

The operator edits ``~/.cpersona/operating-context.toml`` (or
``CPERSONA_OPERATING_CONTEXT_PATH``); no tool ever writes it. Two things read it:

- ``get_operating_context``: the preview tier, or one doctrine section's body;
- the Hard layer, :func:`resolve_project`, which the MCP dispatch applies to
  every tool whose declaration has a project axis (AX-5) before its service
  runs: it turns ``project_id="@auto"`` into the agent's default project and
  checks explicit projects against the registry (OC-7..OC-11).

The file is re-read whenever its modification time or size changes (OC-3), so
edits apply live. A missing, disabled or broken file leaves the feature
dormant: nothing is validated or rewritten, and nothing fails to start (OC-2).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cpersona.config import Settings
from cpersona.services.app import App
from cpersona.services.requests import Request

AUTO = "@auto"
MAX_FILE_BYTES = 1 << 20  # an operator's rule file, not a corpus
SUMMARY_SIZE_HINT = 3000  # longer summaries are reported by check_health (OC-5)
ENFORCE_MODES = ("off", "warn", "reject")

Status = Literal["disabled", "absent", "unusable", "active"]


class ContextError(ValueError):
    """Why a file is unusable; the message is shown to the operator as is."""


@dataclass(frozen=True)
class OperatingContext:
    """A validated file (OC-1)."""

    revision: str = ""
    summary: str = ""
    project_ids: tuple[str, ...] = ()
    enforce: str = "warn"
    defaults: dict[str, str] = field(default_factory=dict)
    doctrine: dict[str, str] = field(default_factory=dict)

    @property
    def section_names(self) -> list[str]:
        return sorted(self.doctrine)  # OC-6


@dataclass(frozen=True)
class ContextState:
    """What the file currently is: disabled, absent, unusable (with why) or active."""

    status: Status
    path: Path
    context: OperatingContext | None = None
    error: str | None = None

    @property
    def active(self) -> OperatingContext | None:
        return self.context if self.status == "active" else None

    def dormant_message(self) -> str:
        why = {
            "disabled": "disabled (CPERSONA_OPERATING_CONTEXT=off)",
            "absent": f"no sidecar file at {self.path}",
            "unusable": f"sidecar unusable: {self.error}",
        }[self.status]
        return f"operating context is dormant — {why}"


# -- reading the file -------------------------------------------------------------------


def parse_context(data: bytes) -> OperatingContext:
    """Validate the file's bytes (OC-1); raises ContextError naming the first problem."""
    import tomllib  # only where a sidecar file exists: most starts read none

    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ContextError(f"not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ContextError(str(exc)) from None

    version = doc.get("version")
    if type(version) is not int or version != 1:  # noqa: E721 — a TOML boolean is not the integer 1
        raise ContextError("version must be the integer 1")
    revision = doc.get("context_revision", "")
    if not isinstance(revision, str):
        raise ContextError("context_revision must be a string")

    instructions = _table(doc, "instructions")
    summary = instructions.get("summary", "")
    if not isinstance(summary, str):
        raise ContextError("instructions.summary must be a string")

    registry = _table(doc, "registry")
    project_ids = registry.get("project_ids", [])
    if not isinstance(project_ids, list) or not all(isinstance(p, str) for p in project_ids):
        raise ContextError("registry.project_ids must be a list of strings")
    enforce = registry.get("enforce", "warn")
    if enforce not in ENFORCE_MODES:
        raise ContextError("registry.enforce must be one of " + ", ".join(f'"{m}"' for m in ENFORCE_MODES))

    defaults = _table(doc, "defaults")
    if not all(isinstance(v, str) for v in defaults.values()):
        raise ContextError("defaults must map agent ids to project id strings")

    sections = doc.get("doctrine", [])
    if not isinstance(sections, list) or not all(isinstance(s, dict) for s in sections):
        raise ContextError("doctrine must be an array of tables ([[doctrine]])")
    doctrine: dict[str, str] = {}
    for index, section in enumerate(sections, start=1):
        name, body = section.get("name"), section.get("body")
        if not isinstance(name, str) or not name:
            raise ContextError(f"doctrine section {index} needs a non-empty string name")
        if not isinstance(body, str):
            raise ContextError(f"doctrine section '{name}' needs a string body")
        if name in doctrine:
            raise ContextError(f"doctrine section name '{name}' is used twice")
        doctrine[name] = body

    return OperatingContext(revision, summary, tuple(project_ids), enforce, dict(defaults), doctrine)


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ContextError(f"{name} must be a table")
    return value


def read_state(settings: Settings) -> ContextState:
    """Read and validate the file now, without any cache."""
    path = settings.operating_context_path
    if not settings.operating_context_enabled:
        return ContextState("disabled", path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return ContextState("absent", path)
    except OSError as exc:
        return ContextState("unusable", path, error=exc.strerror or str(exc))
    if len(data) > MAX_FILE_BYTES:
        return ContextState("unusable", path, error=f"the file is larger than {MAX_FILE_BYTES} bytes")
    try:
        return ContextState("active", path, parse_context(data))
    except ContextError as exc:
        return ContextState("unusable", path, error=str(exc))


class ContextCache:
    """The last parse of the file and the file identity it was made from: ``App.operating_context``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple[Any, ...] | None = None
        self.state: ContextState | None = None


def _file_key(settings: Settings) -> tuple[Any, ...]:
    path = settings.operating_context_path
    try:
        info = os.stat(path)
    except OSError:
        return (settings.operating_context_enabled, str(path), None)
    return (settings.operating_context_enabled, str(path), info.st_mtime_ns, info.st_size, info.st_ino)


def context_state(app: App) -> ContextState:
    """The file's state, re-parsed only when the file changed (OC-3)."""
    cache = app.operating_context
    key = _file_key(app.settings)
    with cache.lock:
        if cache.state is None or cache.key != key:
            cache.state, cache.key = read_state(app.settings), key
        return cache.state


def instructions_summary(settings: Settings) -> str | None:
    """The summary for the MCP ``initialize`` instructions, read once at start (OC-4)."""
    context = read_state(settings).active
    if context is None or not context.summary.strip():
        return None
    return context.summary


# -- the tool -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SectionArguments(Request):
    """``get_operating_context``'s arguments; the default is the schema's (the preview tier)."""

    section: str = ""


def get_operating_context(app: App, *, section: Any = "") -> dict[str, Any]:
    """:func:`answer_get_operating_context` for a library caller, whose arguments no schema has checked."""
    if not isinstance(section, str):
        context = context_state(app).active
        if context is not None:  # dormant: the dormant answer comes first, whatever was asked
            return {"ok": False, "error": "section must be a string", "doctrine_sections": context.section_names}
        section = ""
    return answer_get_operating_context(app, SectionArguments(section=section))


def answer_get_operating_context(app: App, args: SectionArguments) -> dict[str, Any]:
    """The preview tier, or one doctrine section's body when ``section`` names one (§10.2)."""
    state = context_state(app)
    context = state.active
    if context is None:
        return {"ok": False, "enabled": False, "error": state.dormant_message()}
    section = args.section
    if section:
        if section not in context.doctrine:
            return {
                "ok": False,
                "error": f"unknown doctrine section '{section}'",
                "doctrine_sections": context.section_names,
            }
        return {"ok": True, "context_revision": context.revision, "section": section, "body": context.doctrine[section]}
    return {
        "ok": True,
        "context_revision": context.revision,
        "instructions_summary": context.summary,
        "registry": {"project_ids": list(context.project_ids), "enforce": context.enforce},
        "defaults": dict(context.defaults),
        "doctrine_sections": context.section_names,
    }


# -- the Hard layer ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectResolution:
    """The project to use, and the keys to add to the tool's normal answer (OC-11)."""

    project_id: Any
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProjectRefusal:
    """A write the registry refuses (``enforce = "reject"``); nothing may be written."""

    message: str
    revision: str

    @property
    def fields(self) -> dict[str, Any]:
        """Keys every refusal carries besides the tool's own failure fields."""
        return {"operating_context_revision": self.revision}


def resolve_project(
    app: App, project_id: Any, *, agent_id: Any = "", writes: bool
) -> ProjectResolution | ProjectRefusal:
    """Apply the Hard layer to one call's ``project_id`` (spec OC-7..OC-11).

    ``writes`` says whether the call writes (refusable) or reads (warned at
    most, AX-5). Anything but a non-empty string passes through untouched, for
    the caller's own type checks to judge.
    """
    if not isinstance(project_id, str) or project_id == "":  # OC-7
        return ProjectResolution(project_id)

    context = context_state(app).active
    if context is None:  # OC-7, OC-11: a dormant context echoes @auto, used literally
        return ProjectResolution(project_id, {"resolved_project_id": AUTO} if project_id == AUTO else {})

    annotations: dict[str, Any] = {}
    rev = context.revision
    if project_id == AUTO:  # OC-8
        agent = agent_id if isinstance(agent_id, str) else ""
        mapped = context.defaults.get(agent)
        if mapped is None:
            note = f"@auto has no [defaults] mapping for agent_id '{agent}' (rev {rev})"
            if writes and context.enforce == "reject":
                return ProjectRefusal(note, rev)
            if context.enforce != "off":
                annotations["operating_context_warning"] = f"{note}; resolved to '' (global pool)"
            mapped = ""
        annotations["resolved_project_id"] = mapped
        project_id = mapped
        if project_id == "":
            return ProjectResolution("", annotations)

    if context.enforce != "off" and project_id not in context.project_ids:  # OC-9
        note = f"project_id '{project_id}' not in registry (rev {rev})"
        if writes and context.enforce == "reject":
            return ProjectRefusal(note, rev)
        annotations["operating_context_warning"] = note
    return ProjectResolution(project_id, annotations)
