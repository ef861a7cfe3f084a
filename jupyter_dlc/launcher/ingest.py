"""Rank reports from arrival to SQLite, off the event loop's critical path.

A report (one rank's, or one node's batch of its ranks') is parsed and checked when it
arrives: small bodies on the event loop (a thread hop costs more than they do), large ones on
a parser thread so that /healthz and the views' reads go on meanwhile. A checked report is
queued for one writer thread, which stores everything queued since its last commit in one
SQLite transaction (group commit): the cost of a commit is shared by every report waiting,
however many ranks report at once. A report is acknowledged only after its transaction
committed, so a launcher killed at any moment loses no acknowledged point (WAL keeps a
committed transaction across a process kill).

Between commits the writer runs the retention's slices (retention.py), so that downsampling
never competes with ingest for SQLite's one write lock.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from . import bodies

log = logging.getLogger("jupyter_dlc.launcher")

# Parsing a body this small on the loop is cheaper than handing it to a thread.
INLINE_PARSE = 64 << 10
# One transaction takes at most this many reports; more wait for the next (a commit must stay
# short, as readers and the retention share the database).
MAX_GROUP = 512
MAINTENANCE_EVERY = 0.5


class ReportIngest:
    def __init__(self, store, maintenance: Callable[[], Any] | None = None):
        self.store = store
        self.maintenance = maintenance
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlc-parse")
        self.commits = 0
        self._maintained = 0.0
        self._thread = threading.Thread(target=self._run, name="dlc-ingest", daemon=True)
        self._thread.start()

    async def parse(self, raw: bytes) -> dict:
        """The report, checked (bodies.REPORT); raises SpecError naming the field."""
        if len(raw) <= INLINE_PARSE:
            return bodies.parse_body(raw, bodies.REPORT)
        return await asyncio.get_running_loop().run_in_executor(
            self._parser, bodies.parse_body, raw, bodies.REPORT)

    def store_reports(self, job_id: str, attempt: int, reports: list[dict]) -> Future:
        """Queue checked rank reports of one job attempt; the future is done once committed."""
        done: Future = Future()
        self._queue.put((job_id, attempt, reports, done))
        return done

    def _run(self) -> None:
        while True:
            try:
                group = [self._queue.get(timeout=MAINTENANCE_EVERY)]
            except queue.Empty:  # idle: retention still runs
                self._maintain()
                continue
            while len(group) < MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._commit(group)
            # When idle, and under constant load at least every MAINTENANCE_EVERY seconds
            # (or the database would grow without bound while busy).
            if self._queue.empty() or time.monotonic() - self._maintained > MAINTENANCE_EVERY:
                self._maintain()

    def _maintain(self) -> None:
        self._maintained = time.monotonic()
        if self.maintenance is None:
            return
        try:
            self.maintenance()
        except Exception:  # noqa: BLE001 - retention must never stop ingest
            log.exception("metrics retention failed; ingest goes on")

    def _commit(self, group: list) -> None:
        try:
            self.store.record_reports([(job, attempt, reports) for job, attempt, reports, _ in group])
        except Exception as error:  # noqa: BLE001 - one bad report must not fail the others
            if len(group) == 1:
                group[0][3].set_exception(error)
                return
            # Store them one by one, so that only what cannot be stored fails (and is retried).
            for item in group:
                self._commit([item])
            return
        self.commits += 1
        for item in group:
            item[3].set_result(True)

