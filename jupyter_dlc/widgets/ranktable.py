"""The rank table's page size and orders as the notebook view offers them. The launcher
sorts and pages (`GET /api/jobs/{job}?rank_sort=&rank_page=`, `Store.rank_page`, whose
RANK_ORDERS these keys name), so that a view of 4,096 ranks reads 50 rows, not 4,096.

Orders (the same in the panel, labextension/src/views.ts):
- "rank": by node, then rank;
- "step": slowest first: the lowest last step (no step yet counts as lowest), then rank;
- "heartbeat": oldest heartbeat first (none yet counts as oldest), then rank.
"""

from __future__ import annotations

PAGE_SIZE = 50
SORTS = (("rank", "by rank"), ("step", "slowest step first"), ("heartbeat", "oldest heartbeat first"))
