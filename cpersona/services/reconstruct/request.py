"""Stage 0 of reconstruct: check the arguments and resolve count, budget and bounds (spec §8.4).

Count and breadth are separate dials (RX-6): ``count`` bounds the items
returned, ``top_k`` / ``max_hops`` / ``max_evidence`` bound the work done to
find them, and changing one never moves the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cpersona.config import Settings
from cpersona.services.recall.time_cue import TimeCue, parse_time_cue
from cpersona.services.recall.service import RecallArguments, RecallRequest, check_arguments, resolve_request
from cpersona.services.requests import Request as ToolRequest
from cpersona.services.responses import ToolFailure

MODES = ("lite", "pro")
PRO_COUNT = 15  # pro's default and lowest maximum (RX-3)
LITE_BUDGET = 2800  # lite's budget when the caller gives none (RX-4)
MAX_HOPS = 5
MAX_EVIDENCE = 100


def refusal(message: str, **extra: Any) -> ToolFailure:
    """Every refusal of this tool has the one shape of RX-1."""
    return ToolFailure(message, items=[], returned_count=0, **extra)


@dataclass(frozen=True, slots=True)
class Policy:
    source: str  # operator_forced | caller | server_default
    clamped: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "clamped": self.clamped, "reason": self.reason}

    def worth_showing(self) -> bool:
        """RX-40: shown when the server did something other than asked (a clamp, a raise, a forced value)."""
        return self.clamped or self.source == "operator_forced"


@dataclass(slots=True)
class Bounds:
    top_k: int
    max_hops: int
    max_evidence: int
    effective_top_k: int | None = None  # the recall library maximum bound top_k (RX-6)
    lowered: bool = False  # a value outside the published schema was brought into range
    omitted: list[str] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)

    def as_dict(self, *, always: bool = False) -> dict[str, Any] | None:
        if not (always or self.omitted or self.reached or self.effective_top_k is not None or self.lowered):
            return None
        out: dict[str, Any] = {"top_k": self.top_k, "max_hops": self.max_hops, "max_evidence": self.max_evidence}
        if self.effective_top_k is not None:
            out["effective_top_k"] = self.effective_top_k
        if self.omitted:
            out["omitted"] = list(self.omitted)
        if self.reached:
            out["reached"] = list(self.reached)
        return out


@dataclass(slots=True)
class Request:
    recall: RecallRequest  # the candidate recall: limit = top_k (RX-9)
    mode: str | None
    trace: bool
    time_cue: TimeCue | None
    requested_count: int | None
    effective_count: int
    count_policy: Policy
    requested_budget: int | None
    bounds: Bounds


@dataclass(frozen=True)
class ReconstructArguments(ToolRequest):
    """``reconstruct``'s arguments in the types its schema declares; None is "not given" (RX-3 … RX-6)."""

    agent_id: str
    query: str
    count: int | None = None
    top_k: int | None = None
    max_hops: int | None = None
    max_evidence: int | None = None
    deep: bool = False
    channel: str = ""
    project_id: str | None = None
    source_id: str = ""
    trace: bool = False
    budget: int | None = None
    session_key: str = ""
    time_cue: Mapping[str, Any] | None = None
    mode: str | None = None
    lite: bool = False


_RECALL_FIELDS = ("agent_id", "query", "deep", "channel", "session_key", "project_id", "source_id")
_INTEGERS = ("count", "budget", "top_k", "max_hops", "max_evidence")  # the order they are checked in


def _int_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise refusal(f"{name} must be an integer")
    return value


def _flag(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise refusal(f"{name} must be true or false")
    return value


def resolve_mode(mode: str | None, lite_on: bool) -> str | None:
    """RX-1: ``lite: true`` is the older spelling of ``mode: "lite"``; both at once is refused."""
    if mode is not None:
        if mode not in MODES:
            raise refusal(f"mode must be one of {list(MODES)}")
        if lite_on:
            raise refusal('pass mode or lite, not both: lite=true is mode "lite"')
        return mode
    return "lite" if lite_on else None


def resolve_count(settings: Settings, requested: int | None, mode: str | None) -> tuple[int, Policy]:
    """RX-3: ``min(max(0, forced ?? requested ?? default), maximum)``."""
    ceiling = settings.reconstruct_max_count
    default = settings.reconstruct_default_count or min(10, ceiling)
    if mode == "pro":
        ceiling, default = max(ceiling, PRO_COUNT), PRO_COUNT
    forced = settings.reconstruct_forced_count
    if forced is not None:
        base, source, reason = forced, "operator_forced", "forced_count_set"
    elif requested is not None:
        base, source, reason = requested, "caller", "count_requested"
    else:
        base, source, reason = default, "server_default", "count_omitted"
    effective = min(max(0, base), ceiling)
    return effective, Policy(source, effective < base, reason)


def one_head_quote(settings: Settings) -> int:
    return settings.reconstruct_quote_chars or settings.recall_preview_chars


def window_quote_chars(settings: Settings, items: int) -> int:
    """What ``items`` head quotes can take at most: full quotes first, tail quotes after (RX-4)."""
    full = settings.reconstruct_quote_chars or settings.recall_preview_chars
    tail = settings.reconstruct_tail_quote_chars or full
    head = min(items, settings.reconstruct_full_quotes)
    return head * full + max(0, items - head) * tail


def resolve_budget(
    settings: Settings, requested: int | None, mode: str | None, items: int
) -> tuple[int | None, Policy | None]:
    """RX-4 / RX-5: the quoted-character budget and, when it differs from what was asked, why.

    ``None`` means no character budget (pro without a caller or forced budget:
    the token cap bounds the answer instead; its policy says so).
    Whether the policy is shown is RX-40's business (:func:`Policy.worth_showing`).
    """
    forced = settings.reconstruct_forced_budget
    if forced is not None:
        base, source, reason = forced, "operator_forced", "forced_budget_set"
    elif requested is not None:
        base, source, reason = requested, "caller", "budget_requested"
    elif mode == "pro":
        return None, Policy("server_default", False, "bounded_by_the_cap")  # RX-5
    elif mode == "lite":
        base, source, reason = LITE_BUDGET, "server_default", "budget_omitted"
    else:
        base, source, reason = settings.reconstruct_default_budget, "server_default", "budget_omitted"
        fits = window_quote_chars(settings, items)
        if fits > base:
            base, reason = fits, "default_fits_the_window"
    budget = min(base, settings.reconstruct_max_budget)
    floor = one_head_quote(settings)
    if budget < floor:
        budget, reason = floor, "raised_to_one_excerpt"
    return budget, Policy(source, budget != base, reason)


def _bound(value: int | None, default: int, low: int, high: int) -> tuple[int, bool]:
    chosen = default if value is None else value
    applied = max(low, min(high, chosen))
    return applied, applied != chosen


def check_reconstruct_arguments(arguments: Mapping[str, Any]) -> ReconstructArguments:
    """A library caller's arguments checked as the tool's schema checks a tool call's (RX-1)."""
    given = {key: value for key, value in arguments.items() if value is not None}
    try:
        recall_args = check_arguments({k: v for k, v in given.items() if k in _RECALL_FIELDS})
    except ToolFailure as failure:
        raise refusal(failure.message) from None
    lite = _flag("lite", given.get("lite"))
    resolve_mode(given.get("mode"), lite)  # refused in the order parse() meets them
    try:
        parse_time_cue(given.get("time_cue"))
    except ToolFailure as failure:
        raise refusal(failure.message) from None
    integers = {name: _int_or_none(name, given.get(name)) for name in _INTEGERS}
    return ReconstructArguments(
        **{name: getattr(recall_args, name) for name in _RECALL_FIELDS},
        **integers,
        trace=_flag("trace", given.get("trace")),
        time_cue=given.get("time_cue"),
        mode=given.get("mode"),
        lite=lite,
    )


def parse(app: Any, args: ReconstructArguments) -> Request:
    """Resolve every argument before anything is read (RX-1, RX-2)."""
    settings: Settings = app.settings
    try:
        recall_req = resolve_request(app, RecallArguments(**{name: getattr(args, name) for name in _RECALL_FIELDS}))
    except ToolFailure as failure:
        raise refusal(failure.message) from None
    mode = resolve_mode(args.mode, args.lite)
    try:
        cue = parse_time_cue(args.time_cue)  # RX-2: an unreadable cue stops here
    except ToolFailure as failure:
        raise refusal(failure.message) from None
    top_k, low_k = _bound(args.top_k, settings.reconstruct_top_k, 1, 100)
    hops, low_h = _bound(args.max_hops, settings.reconstruct_max_hops, 0, MAX_HOPS)
    evidence, low_e = _bound(args.max_evidence, settings.reconstruct_max_evidence, 1, MAX_EVIDENCE)
    library_max = settings.recall_library_max_limit
    effective_top_k = min(top_k, library_max)
    bounds = Bounds(
        top_k, hops, evidence, effective_top_k if effective_top_k != top_k else None, lowered=low_k or low_h or low_e
    )
    count, count_policy = resolve_count(settings, args.count, mode)
    return Request(
        recall=replace(recall_req, limit=effective_top_k),
        mode=mode,
        trace=args.trace,
        time_cue=cue,
        requested_count=args.count,
        effective_count=count,
        count_policy=count_policy,
        requested_budget=args.budget,
        bounds=bounds,
    )
