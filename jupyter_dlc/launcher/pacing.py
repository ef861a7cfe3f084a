"""How often each reporter should send, so that the launcher's request rate stays bounded.

A launcher's cost is mostly per point stored, but each request adds a fixed share (HTTP,
routing, the token check, one queue hop, an answer): at 4,096 ranks on 512 nodes, each
node's reporter sending every quarter second is 2,048 requests a second, and the same points
sent once a second were taken at nearly twice the rate (benchmarks/HISTORY.md). So, as an
OpenTelemetry batch processor or a Prometheus scrape interval does, the pace gives way to
scale: every report answer carries `report_interval`, the seconds the sender (a node
reporter, or a rank reporting directly) should leave between its requests. Senders are
counted over the last ACTIVE_WINDOW seconds, and the interval is what keeps them all within
REQUEST_BUDGET requests a second, never above MAX_INTERVAL (a node reporter holds its
ranks' requests that long, well under their HTTP timeout). Below the budget it is 0: a
small job keeps its quarter-second live view.
"""

from __future__ import annotations

import threading
import time

from ..report_client import MAX_PACE as MAX_INTERVAL
from .retention import positive_env_int

REQUEST_BUDGET = 500        # report requests a second the launcher aims to take, all jobs
ACTIVE_WINDOW = 5.0         # a sender not heard from for this long no longer counts
RECOMPUTE_EVERY = 1.0


class ReportPacer:
    def __init__(self, budget: int = REQUEST_BUDGET):
        self.budget = budget
        self.interval = 0.0
        self._seen: dict[tuple, float] = {}
        self._computed = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> ReportPacer:
        """DLC_REPORT_BUDGET: report requests a second (ValueError naming it when not >= 1)."""
        return cls(positive_env_int("DLC_REPORT_BUDGET", REQUEST_BUDGET))

    def heard(self, sender: tuple, now: float | None = None) -> float:
        """Note a request from `sender` (job, "node" or "rank", number); the interval to answer."""
        now = time.monotonic() if now is None else now
        with self._lock:
            joined = sender not in self._seen
            self._seen[sender] = now
            if now - self._computed >= RECOMPUTE_EVERY:
                self._computed = now
                horizon = now - ACTIVE_WINDOW
                self._seen = {key: t for key, t in self._seen.items() if t >= horizon}
                self.interval = self._interval_for(len(self._seen))
            elif joined:
                # A job's nodes start together: the pace rises as they join, not a second
                # later (512 nodes at a quarter second are 2,048 requests in that second). It
                # falls only at a recompute, so answers do not flap.
                self.interval = max(self.interval, self._interval_for(len(self._seen)))
            return self.interval

    def _interval_for(self, senders: int) -> float:
        wanted = senders / self.budget
        # Rounded so that answers do not change with every sender coming and going.
        return 0.0 if wanted <= 0.25 else min(MAX_INTERVAL, round(wanted * 4) / 4)
