"""Wakes a job's metrics streams the moment a report of the job committed.

The report route learns of each commit on the event loop (the ingest worker's answer), and
a view's metrics stream (app.MetricsStreamHandler) waits here instead of looking at the
store's write counter every 20 ms: that look was up to 20 ms (10 on average) of every
point's way from the rank to the views (benchmarks/live_view.py). Writes made on other
threads (the supervisor's) do not come through here; the streams still look for them at
their old pace. Event loop only: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib


class Committed:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future]] = {}

    def notify(self, job_id: str) -> None:
        """A report of `job_id` committed: wake every stream of the job waiting now."""
        for waiter in self._waiting.pop(job_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, job_id: str, timeout: float) -> bool:
        """Until the next report of `job_id` commits, at most `timeout` seconds; True when
        one did."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, set()).add(waiter)
        try:
            # asyncio's own: not the builtin TimeoutError before Python 3.11
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            waiters = self._waiting.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[job_id]
        return waiter.done() and not waiter.cancelled()
