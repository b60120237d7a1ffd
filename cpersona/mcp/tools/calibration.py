"""Calibration and precision: ``calibrate_threshold``, ``set_recall_precision``, ``get_recall_precision``."""

from __future__ import annotations

from cpersona.mcp.pause_gate import Skip
from cpersona.mcp.registry import READ_ONLY, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import SESSION_KEY, object_schema

# Both writers re-sample on every run, so repeating one is not a no-op.
_RECALIBRATES = Annotations(read_only=False, destructive=False, idempotent=False)

CALIBRATE_THRESHOLD = ToolSpec(
    name="calibrate_threshold",
    contracts="memory-and-recall.md §3.11",
    description=(
        "Derive the vector-similarity threshold from the stored memories themselves, with no labels. "
        "A random sample of embedded memories is drawn and the similarity of every pair in it forms the "
        "null distribution (unrelated pairs); the threshold is placed above it so chance resemblance is "
        "turned away. method='separation' (the default) weighs that null against related pairs - memories "
        "written within minutes of each other in one session, or each memory's nearest neighbour when the "
        "store has too few such pairs - and picks the point that best tells them apart; 'percentile' takes a "
        "quantile of the null (steadier for embedding models whose similarities are all high, such as "
        "bge-m3); 'zscore' takes mean + z*std. It adapts to the embedding model and to this corpus. "
        "agent_id '' calibrates the global threshold over every agent; a named agent also gets its "
        "post-fusion quality gate re-measured at its precision. At least 10 embedded memories are needed. "
        "The result applies at once and is saved beside the database (sidecar_persisted says whether the "
        "save worked)."
    ),
    input_schema=object_schema(
        {
            "agent_id": {
                "type": "string",
                "description": "Agent whose memories are sampled; '' for the global threshold.",
            },
            "sample_size": {
                "type": "integer",
                "description": "How many embeddings to sample (default 200; at most CPERSONA_CALIBRATE_MAX_SAMPLE).",
            },
            "z_factor": {
                "type": "number",
                "description": "Multiplier of the standard deviation for method='zscore' (default 1.0; higher is stricter).",
            },
            "method": {
                "type": "string",
                "enum": ["separation", "percentile", "zscore"],
                "description": (
                    "'separation' (default): learn the operating point from unrelated pairs versus memories written "
                    "close together in one session (nearest neighbours when there are too few); 'percentile'; or "
                    "'zscore'."
                ),
            },
            "percentile": {
                "type": "number",
                "description": "Quantile of the null distribution for method='percentile' (default 0.95; higher is stricter; 95 reads as 0.95).",
            },
            "session_key": SESSION_KEY,
        },
        required=["agent_id"],
    ),  # fmt: skip
    annotations=_RECALIBRATES,
    service=ServiceRef("cpersona.services.calibration.service", "answer_calibrate_threshold"),
    request=Ref("cpersona.services.calibration.service", "CalibrationArguments"),
    paused=Skip(Ref("cpersona.services.calibration.service", "paused_calibration_body")),
)

SET_RECALL_PRECISION = ToolSpec(
    name="set_recall_precision",
    contracts="memory-and-recall.md §3.12",
    description=(
        "Choose how picky an agent's recall is (knob 3) and re-measure its quality gate to match. "
        "precision strict / balanced / lenient sets the specificity weight beta to 2.0 / 1.0 / 0.5 in the "
        "gate's objective (sensitivity + beta * specificity): strict puts the gate higher, so fewer unrelated "
        "rows get through and more true ones are missed; lenient puts it lower, the other way round. A raw "
        "beta above 0 takes precedence over the named level; precision '' with beta <= 0 removes the agent's "
        "own setting and returns it to the global CPERSONA_RECALL_PRECISION. The gate is recalibrated at the "
        "new beta straight away and saved, so the change is live without a restart. The setting belongs to "
        "the agent rather than to each recall because the gate is computed in advance for one beta. It needs "
        "an embedding backend and at least 10 embedded memories; if the gate cannot be measured the call "
        "fails and the previous setting stays."
    ),
    input_schema=object_schema(
        {
            "agent_id": {"type": "string", "description": "Agent whose precision is set."},
            "precision": {
                "type": "string",
                "description": "strict / balanced / lenient. '' together with beta <= 0 removes the agent's own setting.",
                "default": "",
            },
            "beta": {
                "type": "number",
                "description": "Raw specificity weight; above 0 it overrides precision.",
                "default": 0,
            },
            "session_key": SESSION_KEY,
        },
        required=["agent_id"],
    ),  # fmt: skip
    annotations=_RECALIBRATES,
    service=ServiceRef("cpersona.services.calibration.precision", "answer_set_recall_precision"),
    request=Ref("cpersona.services.calibration.precision", "PrecisionUpdateArguments"),
    paused=Skip(Ref("cpersona.services.calibration.precision", "paused_precision_body")),
)

GET_RECALL_PRECISION = ToolSpec(
    name="get_recall_precision",
    contracts="memory-and-recall.md §3.13",
    description=(
        "Read an agent's effective recall precision (knob 3), the companion of set_recall_precision: the beta "
        "in force and its name (strict / balanced / lenient, or 'custom' for any other beta), whether the "
        "agent has its own setting (overridden) and the global CPERSONA_RECALL_PRECISION default "
        "(global_precision, global_beta). Read-only: it never recalibrates and never saves anything, so a "
        "settings screen can load the current value, let the user change it and write it back."
    ),
    input_schema=object_schema(
        {"agent_id": {"type": "string", "description": "Agent whose precision is read."}}, required=["agent_id"]
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.calibration.precision", "answer_get_recall_precision"),
    request=Ref("cpersona.services.calibration.precision", "PrecisionArguments"),
)

TOOLS = [CALIBRATE_THRESHOLD, SET_RECALL_PRECISION, GET_RECALL_PRECISION]
