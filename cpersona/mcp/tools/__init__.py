"""Tool declarations, grouped by purpose; :func:`default_registry` collects them all."""

from __future__ import annotations

from cpersona.mcp.registry import Registry
from cpersona.mcp.tools import (
    admin,
    associations,
    calibration,
    contents,
    episodes,
    health,
    listing,
    memory,
    operations,
    persistence,
    portability,
    profiles,
    recall,
    recall_context,
    reconstruct,
)

# The order tools/list shows, following the reference's: the pause, write (store, then declare_associations
# and traverse), search (recall,
# recall_with_context, get_contents), profile, episodes, listings, administration, calibration, portability,
# health, then operations (operating context, queue, channel migration, update check).
_GROUPS = (
    persistence,
    memory,
    associations,
    recall,
    recall_context,
    contents,
    reconstruct,
    profiles,
    episodes,
    listing,
    admin,
    calibration,
    portability,
    health,
    operations,
)


def default_registry() -> Registry:
    return Registry(spec for group in _GROUPS for spec in group.TOOLS)
