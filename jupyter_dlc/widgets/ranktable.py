"""The rank table's page size and orders as the notebook view offers them. The launcher
sorts and pages (`GET /api/jobs/{job}?rank_sort=&rank_page=`, `Store.rank_page`, whose
RANK_ORDERS these keys name), so that a view of 4,096 ranks reads 50 rows, not 4,096.

Orders (the same in the panel, labextension/src/views.ts):
- "rank": by node, then rank;
- "step": slowest first: the lowest last step (no step yet counts as lowest), then rank;
- "heartbeat": oldest heartbeat first (none yet counts as oldest), then rank.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE_SIZE = 50
SORTS = (("rank", "by rank"), ("step", "slowest step first"), ("heartbeat", "oldest heartbeat first"))


@dataclass
class RankPage:
    """The page of the rank table a view asks the launcher for: its order (a SORTS key) and
    its number, from 0. The view's rank dropdown and arrows set it; then the page the
    launcher's answer says it gave."""
    order: str = "rank"
    page: int = 0
