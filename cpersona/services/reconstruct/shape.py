"""Stage 7: shaping — compact items, the fields that say what the server changed, and the modes' cap (RX-40 … RX-48)."""

from __future__ import annotations

from typing import Any

from cpersona.services.reconstruct.quote import Quote
from cpersona.services.reconstruct.structure import Item, Row
from cpersona.services.reconstruct.tokens import count_tokens

CAPS = {"lite": 3000, "pro": 5000}


def claim(row: Row, *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": row.ref, "as_of": row.record.timestamp}
    if full or row.why != "seed":
        out["why"] = row.why
    if row.hops is not None:
        out["hops"] = row.hops
    if row.roles:  # empty roles are omitted, in the trace too (as the reference does)
        out["roles"] = list(row.roles)
    return out


def item_dict(
    item: Item, head: Quote, excerpts: list[tuple[Row, Quote]], admitted: int, *, full: bool, mode: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"content": head.content, "head_ref": item.head.ref}
    claims = [claim(r, full=full) for r in item.rows]
    if (
        mode is not None
        and not full
        and len(claims) == 1
        and claims[0] == {"ref": item.head.ref, "as_of": item.head.record.timestamp}
    ):
        out["as_of"] = item.head.record.timestamp  # RX-45: a lone claim identical to the head
    else:
        out["claims"] = claims
    if full or item.independence != "singleton":
        out["independence_reason"] = item.independence
    if item.conflicts:
        out["conflicts"] = item.conflicts
    if item.claims_omitted:
        out["claims_omitted"] = item.claims_omitted
    if item.held:
        out["admission"] = "reservation"
    fields = dict(head.fields)
    if mode is not None and not full:
        fields.pop("ranges", None)
    out.update(fields)
    if full:
        out["quote_basis"] = head.basis
        if head.fields.get("content_len") is not None:
            out["content_truncated"] = True  # RX-41: the quote is not the whole record
    if admitted:
        out["excerpts"] = [{"ref": row.ref, "content": q.content, **q.fields} for row, q in excerpts[:admitted]]
    if len(excerpts) > admitted:
        out["excerpts_omitted"] = len(excerpts) - admitted
    return out


def fit_to_cap(build: Any, steps: int, mode: str) -> tuple[dict[str, Any], int] | None:
    """RX-46: the longest prefix (``build(k)``, k = 1 … steps) whose JSON fits the mode's cap."""
    cap = CAPS[mode]

    def tokens(response: dict[str, Any]) -> int:
        response["mode"], response["cap"], response["used_tokens"] = mode, cap, 0
        used = count_tokens(response)
        for _ in range(3):  # used_tokens counts its own digits
            response["used_tokens"] = used
            again = count_tokens(response)
            if again == used:
                break
            used = again
        return used

    low, high, best = 1, steps, None
    while low <= high:
        mid = (low + high) // 2
        response = build(mid)
        if tokens(response) <= cap:
            best, low = (response, mid), mid + 1
        else:
            high = mid - 1
    return best
