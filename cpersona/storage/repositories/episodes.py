"""Episode rows."""

from __future__ import annotations

from cpersona.storage.models import Episode
from cpersona.storage.repositories.base import Repository


class EpisodeRepository(Repository):
    model = Episode
