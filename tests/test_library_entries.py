"""A tool's two doors give one answer: dispatch's parsed request, and the library entry the CLI and tests call.

Each converted tool has a service ``answer_<tool>(app, request)`` that dispatch
calls with the request it parsed from the schema-checked arguments, and a thin
library entry ``<tool>(app, **arguments)`` that checks raw values and calls the
same service. The rules of meaning a schema cannot state (an empty agent, a
percentile out of range, a path that climbs, two agents that are one) live in
the service, once; so for every such refusal, and for a call that leaves every
optional argument out, both doors must answer alike. Every case here is a
refusal or a read, so both calls see the same database.
"""

from __future__ import annotations

import importlib
import math

import pytest

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry

REGISTRY = default_registry()

# (tool, arguments): arguments the schema accepts, whose answer is the service's own.
CASES = [
    ("calibrate_threshold", {"agent_id": "a"}),  # too few embeddings: refused by the measurement
    ("calibrate_threshold", {"agent_id": "a", "percentile": 150}),
    ("calibrate_threshold", {"agent_id": "a", "z_factor": math.inf}),
    ("calibrate_threshold", {"agent_id": "", "method": "zscore", "sample_size": 0, "z_factor": 0}),
    ("set_recall_precision", {"agent_id": ""}),
    ("set_recall_precision", {"agent_id": "a"}),
    ("set_recall_precision", {"agent_id": "a", "precision": "bogus"}),
    ("set_recall_precision", {"agent_id": "a", "precision": "bogus", "beta": 3}),
    ("set_recall_precision", {"agent_id": "a", "beta": math.nan}),
    ("export_memories", {"agent_id": "", "output_path": ""}),
    ("export_memories", {"agent_id": "a", "output_path": "../out.jsonl"}),
    ("import_memories", {"input_path": ""}),
    ("import_memories", {"input_path": "no/such/export.jsonl", "dry_run": True}),
    ("merge_memories", {"source_agent_id": "", "target_agent_id": "b"}),
    ("merge_memories", {"source_agent_id": "a", "target_agent_id": "a"}),
    ("merge_memories", {"source_agent_id": "a", "target_agent_id": "b", "strategy": "overwrite"}),
    ("merge_memories", {"source_agent_id": "a", "target_agent_id": "b", "mode": "swap"}),
    ("check_health", {"checks": ["no_such_check"]}),
    ("check_health", {"checks": ["duplicate_content", "duplicate_content"]}),
    ("deep_check", {"agent_id": "a", "checks": ["no_such_check"]}),
    ("deep_check", {"agent_id": "a"}),
    ("migrate_channel_axis", {}),
    ("migrate_channel_axis", {"agent_id": "a", "globalize_unrecoverable": True}),
    ("check_update", {}),
]


def library_entry(tool: str):
    """The library function of the module the tool's service lives in, named as the tool."""
    return getattr(importlib.import_module(REGISTRY.get(tool).service.module), tool)


@pytest.mark.anyio
@pytest.mark.parametrize(("tool", "arguments"), CASES, ids=[f"{tool}-{i}" for i, (tool, _) in enumerate(CASES)])
async def test_dispatch_and_the_library_entry_answer_alike(app, tool, arguments):
    through_dispatch = await call_tool(app, REGISTRY, GateChain([]), tool, dict(arguments))
    assert not through_dispatch.is_error, through_dispatch.payload  # the schema let it through
    assert through_dispatch.payload == library_entry(tool)(app, **arguments)


def test_every_converted_tool_of_this_table_has_a_case():
    converted = {
        "calibrate_threshold",
        "set_recall_precision",
        "export_memories",
        "import_memories",
        "merge_memories",
        "check_health",
        "deep_check",
        "migrate_channel_axis",
        "check_update",
    }
    assert converted <= {tool for tool, _ in CASES}
