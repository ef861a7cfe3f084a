"""Rank reports parsed, checked and stored in a process of their own.

Python runs one thread at a time per process. With thousands of ranks, parsing megabytes of
reports a second and storing them, the launcher's event loop, alert rules, views' reads and
the supervisor all waited on one interpreter: a report's answer waited behind an alert
evaluation decoding a second of points, and a view's read behind a group commit
(benchmarks/HISTORY.md, ingest). So the launcher keeps the HTTP side of the report route
(the token, the job's attempt, the pace, the ranks' commands) and hands each body to this
process, which parses and checks it (bodies.REPORT), stores it in group commits
(ingest.ReportIngest) and applies the metrics retention's removals between commits (its
analysis runs in a process of its own, retention_process.py), then answers with the
status and what the launcher needs for its answer. A report is still acknowledged only once
committed.

The two talk over a socket pair, in length-prefixed pickles: `(request, job, attempt, world,
body)`
one way, `(request, status, payload)` the other. The launcher sends from its event loop
without blocking it (what the socket does not take waits in a buffer, so a worker that stops
reading cannot stall /healthz), and reads the
answers there as they arrive: no thread hop on the launcher's side. The worker leaves when
the launcher is gone (its end of the pair closes), so a launcher killed with -9 leaves no
ingest behind; a worker that dies is started again and the reports it held are answered
503, which every reporter retries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import Any

from ..spec import SpecError
from .. import bodies, layout
from .framing import Frames, frame

log = logging.getLogger("jupyter_dlc.launcher")



def report_summary(report: dict, stale: bool) -> dict:
    """What the launcher's answer needs of a checked report: who sent it, and whether a rank
    in it ended (its end or its first error: the supervisor looks at once, not a tick later)."""
    ended = any(event.get("type") in ENDS for rank in rank_reports(report)
                for event in rank.get("events") or ())
    batch = report.get("ranks")
    if batch is None:
        return {"stale": stale, "rank": report.get("rank", 0), "ended": ended}
    return {"stale": stale, "node": report.get("node"), "ended": ended,
            "ranks": sorted({r.get("rank", 0) for r in batch})}


ENDS = (layout.RANK_END, layout.RANK_ERROR)


def rank_reports(report: dict) -> list[dict]:
    """A node's batch (node/reporter.py) holds one report per rank; each is a heartbeat of its
    own rank, so the supervisor's verdict stays per rank."""
    batch = report.get("ranks")
    if batch is None:
        return [report]
    return [dict(r, node=r.get("node", report.get("node"))) for r in batch]


class Once:
    """A batch a rank sent again after its answer was lost (a timeout, a kept connection the
    launcher had closed) is stored once: a rank numbers its batches (`n`, one a batch, per
    process) and sends a batch again whole, under its number. What a number seen before
    carries is dropped; the report still counts as the rank's heartbeat. Bounded: the
    newest numbers of the last MAX_SENDERS senders (a rank's process in an attempt)."""

    MAX_SENDERS = 1 << 16
    ENTRIES = ("metrics", "system", "events")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[tuple, int] = OrderedDict()

    def fresh(self, job_id: str, attempt: int, reports: list[dict]) -> tuple[list[dict], list]:
        """The reports to store, and what was taken (for `failed`)."""
        out, taken = [], []
        with self._lock:
            for report in reports:
                n, pid = report.get("n"), report.get("pid")
                if not isinstance(n, int) or isinstance(n, bool) or pid is None:
                    out.append(report)  # an older runtime: nothing to tell a repeat by
                    continue
                key = (job_id, attempt, report.get("rank", 0), pid)
                before = self._last.get(key, -1)
                if n <= before:
                    out.append({k: v for k, v in report.items() if k not in self.ENTRIES})
                    continue
                self._last[key] = n
                self._last.move_to_end(key)
                taken.append((key, before, n))
                out.append(report)
            while len(self._last) > self.MAX_SENDERS:
                self._last.popitem(last=False)
        return out, taken

    def failed(self, taken: list) -> None:
        """The batches were not stored: the same numbers are welcome again."""
        with self._lock:
            for key, before, n in taken:
                if self._last.get(key) == n:
                    self._last[key] = before


# -- the worker process -------------------------------------------------------------------

def serve(sock: socket.socket, db_path: str, data_dir: str, policy: Any) -> None:
    from .ingest import ReportIngest
    from .retention import Retention
    from .retention_process import AnalysisProcess
    from .storage import DiskGuard
    from .store import Store

    guard = DiskGuard(data_dir)
    store = Store(db_path, guard)
    retention = Retention(store, policy)
    AnalysisProcess(retention, db_path)

    def maintain() -> None:
        guard.check()
        retention.run_slices()

    writer = ReportIngest(store, maintain)
    once = Once()
    sending = threading.Lock()

    def answer(request: int, status: int, payload: Any) -> None:
        try:
            with sending:
                sock.sendall(frame((request, status, payload)))
        except OSError:  # the launcher is gone
            os._exit(0)

    def handle(request: int, job_id: str, attempt: int, world: int, raw: bytes) -> None:
        try:
            report = bodies.parse_body(raw, bodies.REPORT, world)
        except SpecError as error:
            answer(request, 400, str(error))
            return
        if (report.get("attempt") or attempt) != attempt:
            # A straggler of an attempt that already ended: accepted, not stored.
            answer(request, 200, report_summary(report, True))
            return
        summary = report_summary(report, False)
        reports, taken = once.fresh(job_id, attempt, rank_reports(report))

        def committed(future) -> None:
            error = future.exception()
            if error is None:
                answer(request, 200, summary)
            else:
                once.failed(taken)
                answer(request, 500, f"{type(error).__name__}: {error}")

        writer.store_reports(job_id, attempt, reports).add_done_callback(committed)

    frames = Frames()
    while True:
        try:
            data = sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            os._exit(0)  # the launcher ended: nothing here is acknowledged any more
        for message in frames.feed(data):
            handle(*message)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jupyter_dlc.launcher.ingest_worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--policy", required=True, help="the retention policy, pickled, hex")
    args = parser.parse_args()
    # Ctrl-C in the launcher's terminal reaches the whole group: the launcher decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s ingest: %(message)s")
    serve(socket.socket(fileno=args.fd), args.db, args.data_dir, pickle.loads(bytes.fromhex(args.policy)))
    return 0


# -- the launcher's side ------------------------------------------------------------------

class IngestWorker:
    """The launcher's handle on the worker: `submit` a report body, await (status, payload)."""

    def __init__(self, db_path: str, data_dir: str, policy: Any):
        self.db_path = db_path
        self.data_dir = data_dir
        self.policy = policy
        self.starts = 0
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox = bytearray()   # frames the socket has not taken yet
        self._waiting = False        # for the socket to be writable
        self._frames = Frames()
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dlc.launcher.ingest_worker", "--fd", str(theirs.fileno()),
             "--db", self.db_path, "--data-dir", self.data_dir,
             "--policy", pickle.dumps(self.policy).hex()],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self._frames = Frames()
        self.starts += 1
        if self._loop is not None:
            self._loop.add_reader(ours.fileno(), self._on_answers, ours)

    async def submit(self, job_id: str, attempt: int, world: int, raw: bytes) -> tuple[int, Any]:
        """Check and store a report body of a job of `world` ranks: (status, summary or error)."""
        if self._loop is None:  # the first report: the loop runs now
            self._loop = asyncio.get_running_loop()
            assert self.sock is not None
            self._loop.add_reader(self.sock.fileno(), self._on_answers, self.sock)
        self._next += 1
        request = self._next
        future = self._loop.create_future()
        self._pending[request] = future
        self._outbox += frame((request, job_id, attempt, world, raw))
        self._flush()
        return await future

    def _flush(self) -> None:
        """Send what the socket takes now; the rest when it is writable again."""
        sock = self.sock
        assert sock is not None and self._loop is not None
        try:
            sent = sock.send(self._outbox)
        except BlockingIOError:
            sent = 0
        except OSError:  # the worker died: its reader answers what it held, and restarts it
            sent = len(self._outbox)
        del self._outbox[:sent]
        if self._outbox and not self._waiting:
            self._waiting = True
            self._loop.add_writer(sock.fileno(), self._writable)
        elif not self._outbox and self._waiting:
            self._waiting = False
            self._loop.remove_writer(sock.fileno())

    def _writable(self) -> None:
        self._flush()

    def _on_answers(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._restart(sock)
            return
        for request, status, payload in self._frames.feed(data):
            future = self._pending.pop(request, None)
            if future is not None and not future.done():
                future.set_result((status, payload))

    def _restart(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._loop.remove_reader(sock.fileno())
        if self._waiting:
            self._loop.remove_writer(sock.fileno())
        self._waiting = False
        self._outbox = bytearray()
        sock.close()
        code = None
        if self.process is not None:
            # Its socket failed or closed: usually it exited; if not, it is cut off from us
            # anyway, and waiting for it must not hold up the event loop.
            self.process.kill()
            code = self.process.wait()
        log.error("the ingest worker ended (exit %s); starting another", code)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result((503, "ingest: the report was not stored (ingest restarting); retry"))
        self._start()


if __name__ == "__main__":
    sys.exit(main())
