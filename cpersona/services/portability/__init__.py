"""Moving memories in and out: JSONL export/import, agent merge, 2.6 database copy.

Public entry points for library callers (the CLI, tests): ``fn(app, **arguments) -> dict``,
each checking what no schema has checked and calling its tool's service, ``answer_<tool>(app, request)``:

- :func:`export_memories` — spec admin-and-safety.md §6
- :func:`import_memories` — §7 (:func:`vet_import` is its IM-1 vetting alone,
  for the MCP facade to run before the pause gate)
- :func:`merge_memories` — §8 (:func:`validate_merge` likewise)
- :func:`import_db` — the ``cpersona import-db PATH`` command
"""

from cpersona.services.portability.export import export_memories
from cpersona.services.portability.import_db import import_db
from cpersona.services.portability.importer import import_memories, paused_import_body, vet_import
from cpersona.services.portability.merge import merge_memories, paused_merge_body, validate_merge

__all__ = [
    "export_memories",
    "import_db",
    "import_memories",
    "merge_memories",
    "paused_import_body",
    "paused_merge_body",
    "validate_merge",
    "vet_import",
]
