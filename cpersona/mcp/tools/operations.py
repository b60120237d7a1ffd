"""Operating the server: ``get_operating_context``, ``get_queue_status``, ``migrate_channel_axis``, ``check_update``."""

from __future__ import annotations

from cpersona.mcp.demands import ANY_PRINCIPAL, UPDATE_CHECK
from cpersona.mcp.pause_gate import ForceDryRun, PassThrough
from cpersona.mcp.registry import READ_ONLY, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import SESSION_KEY, object_schema

GET_OPERATING_CONTEXT = ToolSpec(
    name="get_operating_context",
    contracts="admin-and-safety.md §10.2",
    description=(
        "Read the rules the operator of this server wrote for every connected client (the operating context). "
        "Called without arguments it answers the overview: context_revision, instructions_summary, the project_id "
        "registry with its enforce mode (off / warn / reject), the [defaults] that '@auto' resolves to per agent, "
        "and doctrine_sections, the names of the longer sections. Pass section with one of those names to read "
        "that section's full body. Read-only: the operator edits the file on the server's filesystem "
        "(~/.cpersona/operating-context.toml by default); no tool can change it. When no usable file exists the "
        "answer is ok:false with enabled:false and the reason."
    ),
    input_schema=object_schema(
        {
            "section": {
                "type": "string",
                "description": "Name of one doctrine section (as listed in doctrine_sections) to read in full; "
                "leave empty for the overview.",
                "default": "",
            },
        }
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.operating_context", "answer_get_operating_context"),
    request=Ref("cpersona.services.operating_context", "SectionArguments"),
    access=ANY_PRINCIPAL,
)

GET_QUEUE_STATUS = ToolSpec(
    name="get_queue_status",
    contracts="admin-and-safety.md §11.4",
    description=(
        "Report the background task queue: how many tasks are waiting (pending, across every agent), whether the "
        "queue runs (enabled), and its retry settings (max_retries, retry_delay in seconds). The queue is kept in "
        "the database, so work interrupted by a restart is picked up again; an empty queue is the normal reading."
    ),
    input_schema=object_schema({}),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.operations.tasks", "answer_get_queue_status"),
    request=Ref("cpersona.services.requests", "Request"),  # no arguments
    access=ANY_PRINCIPAL,
)

MIGRATE_CHANNEL_AXIS = ToolSpec(
    name="migrate_channel_axis",
    contracts="admin-and-safety.md §12",
    description=(
        "Move memories that a bridge filed under the channel type 'discord' onto the concrete channel id, so that "
        "recall scoped to that channel finds them. The channel id is recovered from the memory's "
        "metadata.session_id ('<channel_id>:<user_id>:<chunk>' or '<channel_id>:shared'). The default dry_run=true "
        "only reports: the recoverable count, recoverable_by_channel, samples, and the unrecoverable bucket "
        "('discord' rows without such a session id; rows whose metadata is not JSON are also listed). "
        "dry_run=false moves them in one transaction; it is non-destructive (only the channel column changes; "
        "locked memories move too and stay locked) and idempotent (a second run finds nothing to move). Declared "
        "associations about a moved memory follow it. globalize_unrecoverable=true also moves the unrecoverable "
        "bucket to channel '' (global, seen by every channel-scoped recall). Under pause_persistence a real run is "
        "turned into a dry run and the answer says repairs_skipped."
    ),
    input_schema=object_schema(
        {
            "agent_id": {
                "type": "string",
                "description": "The agent whose memories to re-file; empty for every agent.",
            },
            "dry_run": {
                "type": "boolean",
                "description": "true (the default) reports what would move without changing anything.",
                "default": True,
            },
            "globalize_unrecoverable": {
                "type": "boolean",
                "description": "Also move 'discord' rows whose channel cannot be recovered to channel '' (global). "
                "Off by default.",
                "default": False,
            },
            "session_key": SESSION_KEY,
        },
        required=[],
    ),
    annotations=Annotations(read_only=False),
    service=ServiceRef("cpersona.services.operations.channel_axis", "answer_migrate_channel_axis"),
    request=Ref("cpersona.services.operations.channel_axis", "ChannelAxisArguments"),
    paused=ForceDryRun(),  # P-11: it still reports what it would do
)

CHECK_UPDATE = ToolSpec(
    name="check_update",
    contracts="admin-and-safety.md §13",
    description=(
        "Say whether a newer release of this server exists, and install it only when asked. state is one of: ok "
        "(the newest release runs), newer (a newer final release exists; pre-releases are never proposed), yanked "
        "(the publisher withdrew the running release; reason says why), unlisted (the index does not list the "
        "running version, e.g. a development build), unknown (no check has finished, e.g. no network) or disabled. "
        "The check runs once per process start in the background, and its verdict is cached for 24 hours "
        "(CPERSONA_UPDATE_CHECK_INTERVAL_SECONDS) in update-check.json beside the database; a plain call only reads "
        "that verdict and uses neither the network nor the disk. refresh=true asks the package index now (at most "
        "3 seconds). install names how this server was installed (uvx, pip, checkout or unknown) and the command "
        "that updates it. apply=true runs that command as an argument list, never through a shell, and answers "
        "exit_code and the last 40 lines of output; it works for pip and checkout installs only. A uvx install is "
        "refused (the update belongs in the client's launch arguments, e.g. uvx --from cpersona-server@latest cpersona), and so is a "
        "checkout parked at a tag (detached HEAD), which is answered with the git fetch --tags && git checkout form "
        "to run instead. One apply runs at a time. Nothing is ever updated automatically or as a side effect of "
        "another call, and a restart is always required afterwards. pause_persistence does not affect this tool. "
        "CPERSONA_UPDATE_CHECK=false turns the whole feature off: no request, no cache, no notices, state=disabled."
    ),
    input_schema=object_schema(
        {
            "refresh": {
                "type": "boolean",
                "description": "Ask the package index now instead of answering from the verdict in memory (3 s budget). "
                "If that fails, the verdict already known stays (checked_at unchanged); with none, "
                "state=unknown.",
                "default": False,
            },
            "apply": {
                "type": "boolean",
                "description": "Run the update command shown in install.command (pip and checkout installs only). "
                "Off by default; restart the server afterwards.",
                "default": False,
            },
        }
    ),
    annotations=Annotations(read_only=False),
    service=ServiceRef("cpersona.services.operations.update_check", "answer_check_update"),
    request=Ref("cpersona.services.operations.update_check", "UpdateCheckArguments"),
    access=UPDATE_CHECK,
    paused=PassThrough(),  # P-12: it installs software, not records
)

TOOLS = [GET_OPERATING_CONTEXT, GET_QUEUE_STATUS, MIGRATE_CHANNEL_AXIS, CHECK_UPDATE]
