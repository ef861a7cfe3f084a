"""The rank table's order and pages, as plain data (no widgets), so that 4,096 ranks stay
cheap to show: the view renders one page of PAGE_SIZE rows, in the order the user picked.

Orders (the same in the panel, labextension/src/views.ts):
- "rank": by node, then rank;
- "step": slowest first: the lowest last step (no step yet counts as lowest), then rank;
- "heartbeat": oldest heartbeat first (none yet counts as oldest), then rank.
"""

from __future__ import annotations

PAGE_SIZE = 50
SORTS = (("rank", "by rank"), ("step", "slowest step first"), ("heartbeat", "oldest heartbeat first"))


def _number(value, missing: float) -> float:
    try:
        return float(value) if value is not None else missing
    except (TypeError, ValueError):
        return missing


def sort_key(order: str):
    if order == "step":
        return lambda r: (_number(r.get("last_step"), float("-inf")), r.get("rank") or 0)
    if order == "heartbeat":
        return lambda r: (_number(r.get("last_heartbeat"), float("-inf")), r.get("rank") or 0)
    return lambda r: (r.get("node") or 0, r.get("rank") or 0)


def page_of(ranks: list[dict], order: str, page: int, size: int = PAGE_SIZE) -> tuple[list[dict], int, int]:
    """(the rows of `page`, that page clamped to what exists, how many pages)."""
    pages = max(1, -(-len(ranks) // size))
    page = min(max(0, page), pages - 1)
    ordered = sorted(ranks, key=sort_key(order))
    return ordered[page * size:(page + 1) * size], page, pages
