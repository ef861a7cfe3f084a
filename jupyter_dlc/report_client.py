"""How a rank or a node reporter posts to the launcher's report route: the client side of the
protocol both speak (ARCHITECTURE.md), shared by the runtime inside each rank
(runtime/report.py), the node reporter (node/reporter.py) and the launcher's pacing of them
(launcher/pacing.py). Stdlib and `identity` only: it runs in every rank and on every node.
"""

from __future__ import annotations

import os
import random
import ssl
import time

from . import identity

# The most a batch is held to keep the launcher's pace (`report_interval` in its answers,
# launcher/pacing.py); a rank waits this much longer for its answer than when reporting directly.
MAX_PACE = 1.0
# The file the node's reporter writes its URL to, set by the engine for the reporter and the
# node's ranks: the one place a rank looks for its node reporter, whatever the engine.
ENV = "DLC_NODE_REPORTER"


def launcher_tls(env=os.environ) -> ssl.SSLContext | None:
    """An https launcher (serving other hosts) is trusted through the CA file it names."""
    ca_file = env.get("DLC_LAUNCHER_CA")
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


# 408 and 429 mean "later"; every other 4xx means this body will never be accepted.
RETRYABLE_CLIENT_ERRORS = (408, 429)


def post_until(url: str, data: bytes, token: str, key: str | None, tls: ssl.SSLContext | None,
               deadline: float, timeout: float) -> int | None:
    """POST `data` with the job token, retried while the launcher is unreachable, busy, or
    not proven (its port taken while it restarts), until `deadline` (time.monotonic): the
    status a proven launcher gave, or None when none answered in time. For records a
    process sends as it leaves (a rank's end, a node's exit)."""
    headers = {"Content-Type": "application/json", "Authorization": f"token {token}"}
    pause = 0.1
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            answer = identity.exchange(url, "POST", data, headers, key, min(timeout, left), tls)
        except (OSError, ValueError):
            answer = None  # down or restarting: try again until the deadline
        if answer is not None and answer.proven and (
                answer.status < 500 and answer.status not in RETRYABLE_CLIENT_ERRORS):
            return answer.status
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(1.0, pause * 2)


def paced(answer: dict, most: float) -> float:
    """The `report_interval` a launcher answer asks for, within [0, most]; 0 when absent."""
    try:
        return min(most, max(0.0, float(answer.get("report_interval") or 0.0)))
    except (TypeError, ValueError):
        return 0.0


def phase_shift(before: float, after: float) -> float:
    """The extra wait, once, of a sender whose pace grew from `before` to `after` seconds: a
    random share of the new interval. Senders that started together (a job's nodes, a warm
    pool's ranks) would otherwise keep sending together, every request of a second in its
    first quarter, and queue behind each other at the launcher; spread uniformly over the
    interval they arrive one by one (a Prometheus server spreads its scrape targets the same
    way, by an offset per target). 4,096 ranks: ingest p99 226 ms bunched, see
    benchmarks/HISTORY.md for spread."""
    return random.uniform(0.0, after) if after > before else 0.0
