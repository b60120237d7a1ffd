"""Tool declarations, grouped by purpose; :func:`default_registry` collects them all."""

from __future__ import annotations

from cpersona.mcp.registry import Registry
from cpersona.mcp.tools import episodes, listing, memory, profiles, recall

# The order tools/list shows, following the reference's: write, search, profile, episodes, listings.
_GROUPS = (memory, recall, profiles, episodes, listing)


def default_registry() -> Registry:
    return Registry(spec for group in _GROUPS for spec in group.TOOLS)
