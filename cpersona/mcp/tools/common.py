"""Argument declarations several tools share, so one wording and one bound serve all.

Names, types and bounds match CPersona 2.6.14's published schemas (clients
written against it must keep working); the descriptions are ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpersona.services.responses import failure
from cpersona.services.sanitize import KEY_FIELD_MAX

AGENT_ID: dict[str, Any] = {"type": "string", "description": "The agent whose memory this is."}

SESSION_KEY: dict[str, Any] = {
    "type": "string",
    "description": (
        "A session name you choose. It only picks which no-persist pause applies to this call; "
        "it is not a credential and never filters data. Callers that omit it share one bucket."
    ),
    "default": "",
    "maxLength": KEY_FIELD_MAX,
}

_AUTO = (
    " '@auto' asks for this agent's default project from the server's operating context and is echoed "
    "back as resolved_project_id; when no operating context is configured it is taken literally as the "
    "project named '@auto'. Check resolved_project_id before relying on it."
)

PROJECT_ID_FOR_WRITE: dict[str, Any] = {
    "type": "string",
    "maxLength": KEY_FIELD_MAX,
    "description": "Project the record belongs to; omit or '' for the global pool." + _AUTO,
}

PROJECT_ID_FILTER: dict[str, Any] = {
    "type": "string",
    "description": (
        "Project filter: omitted reads every project, '' only the global pool, 'X' the project X "
        "together with the global pool." + _AUTO
    ),
}

CHANNEL_FOR_WRITE: dict[str, Any] = {
    "type": "string",
    "maxLength": KEY_FIELD_MAX,
    "description": (
        "Conversation channel the record belongs to (e.g. 'chat' or a Discord channel id). "
        "'' (the default) leaves it unscoped, so every channel-scoped read sees it."
    ),
}


def prop(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A shared declaration with some keys changed (usually the description)."""
    return {**base, **changes}


def object_schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return schema


# Refusal shapes for arguments turned away before the service runs (spec G-6).
def lock_flag(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A store sent with lock:true always says whether the lock happened (spec ST-12); here it did not."""
    return {"locked": False} if arguments.get("lock") is True else {}


def store_refusal(reason: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return failure(reason, key="reason", result="rejected", **lock_flag(arguments))


def recall_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return failure(message, messages=[])


def episode_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return failure(message, episode_id=None)


def profile_update_refusal(reason: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return failure(reason, key="reason", profiles_updated=0)
