"""Rank reports from checked to SQLite: group commits on one writer thread.

Runs in the ingest worker (ingest_worker.py), which parses and checks each report as it
arrives. A checked report is queued for one writer thread, which stores everything queued
since its last commit in one SQLite transaction (group commit): the cost of a commit is
shared by every report waiting, however many ranks report at once. A report is acknowledged
only after its transaction committed, so a launcher killed at any moment loses no
acknowledged point (WAL keeps a committed transaction across a process kill).

Between commits the writer runs the retention's slices (retention.py), so that downsampling
never competes with ingest for SQLite's one write lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable


log = logging.getLogger("jupyter_dlc.launcher")

# One transaction takes at most this many reports; more wait for the next (a commit must stay
# short, as readers and the retention share the database).
MAX_GROUP = 512
MAINTENANCE_EVERY = 0.5


class ReportIngest:
    def __init__(self, store, maintenance: Callable[[], Any] | None = None):
        self.store = store
        self.maintenance = maintenance
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.commits = 0
        self._maintained = 0.0
        self._thread = threading.Thread(target=self._run, name="dlc-ingest", daemon=True)
        self._thread.start()

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

