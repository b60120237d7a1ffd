"""Agent profiles: ``get_profile`` (spec §3.7) and ``update_profile`` (spec §3.8).

A profile is caller-written text about the agent's user, one per agent: it is
not scoped by project or channel, and a new one replaces the old (PF-3). Every
write path stores ``user_id = ''``, which with the unique key
(agent_id, user_id) keeps it to one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpersona.services.app import App
from cpersona.services.operations.tasks import Task, TaskFailed, register_handler
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import find_lone_surrogate, nul_refusal, sanitize
from cpersona.services.timestamps import sql_stamp
from cpersona.storage.repositories.profiles import ProfileRepository


@dataclass(frozen=True)
class ProfileArguments(Request):
    """``get_profile``'s arguments in the types its schema declares."""

    agent_id: str


def get_profile(app: App, *, agent_id: Any = None) -> dict[str, Any]:
    """:func:`answer_get_profile` for a library caller, whose arguments no schema has checked."""
    if not isinstance(agent_id, str):
        return ToolFailure("agent_id is required" if agent_id is None else "agent_id must be a string").as_response()
    return answer_get_profile(app, ProfileArguments(agent_id=agent_id))


def answer_get_profile(app: App, args: ProfileArguments) -> dict[str, Any]:
    """``{profile: <text>}``, '' when the agent has none; no ``ok`` on success (G-2)."""
    with app.db.read() as session:
        text = ProfileRepository(session).current(args.agent_id)
    return {"profile": text or ""}


@dataclass(frozen=True)
class ProfileUpdateArguments(Request):
    """``update_profile``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str
    profile: str
    session_key: str = ""


@answers_refusals
def update_profile(app: App, *, agent_id: Any = None, profile: Any = None, session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_update_profile` for a library caller, whose arguments no schema has checked."""
    if not isinstance(agent_id, str):
        raise _refuse("agent_id is required" if agent_id is None else "agent_id must be a string")
    if profile is None:
        profile = ""  # refused below as empty (PF-2), as a schema-checked call sending '' is
    if not isinstance(profile, str):
        raise _refuse(f"profile must be a string, not {type(profile).__name__}")
    return answer_update_profile.raises(app, ProfileUpdateArguments(agent_id=agent_id, profile=profile))


@answers_refusals
def answer_update_profile(app: App, args: ProfileUpdateArguments) -> dict[str, Any]:
    """Replace the agent's profile with caller-computed text (capped, sanitized)."""
    text, truncated = _checked_profile(app, args.agent_id, args.profile)

    now = sql_stamp(app.clock())
    with app.db.write() as session:
        ProfileRepository(session).replace(args.agent_id, text, now)

    response: dict[str, Any] = {"ok": True, "profiles_updated": 1}
    if truncated:
        response["truncated"] = True
    return response


def _refuse(reason: str) -> ToolFailure:
    return ToolFailure(reason, key="reason", profiles_updated=0)


def _checked_profile(app: App, agent_id: str, profile: str) -> tuple[str, bool]:
    if problem := nul_refusal(agent_id=agent_id):
        raise _refuse(problem)
    if profile == "":
        raise _refuse("empty profile")  # PF-2
    if find_lone_surrogate(agent_id, profile):
        raise _refuse("the arguments contain a lone UTF-16 surrogate, which is not valid text; nothing was stored")
    if problem := nul_refusal(profile=profile):
        raise _refuse(problem)  # decision 11
    cleaned = sanitize(profile, app.settings.max_profile_length)  # PF-1
    if cleaned.empty:
        raise _refuse("empty after sanitization")
    return cleaned.text, cleaned.truncated


def _legacy_update_profile(app: App, task: Task) -> dict[str, Any] | None:
    """A queued ``update_profile`` row an older version left behind (spec §11.2, Q-1).

    The payload is the profile text, applied as ``update_profile`` would apply it.
    """
    if not isinstance(task.payload, str):
        raise TaskFailed("update_profile payload is not a text")
    return update_profile(app, agent_id=task.agent_id, profile=task.payload)


register_handler("update_profile", _legacy_update_profile)
