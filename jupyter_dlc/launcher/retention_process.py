"""The metrics retention's analysis in a process of its own, beside the ingest worker.

The analysis (retention.Retention.analyze) is pure Python over every new chunk's series
counts: at 4,096 ranks a pass took 0.3-0.8 s every 10 s. On a thread of the ingest worker it
held that process's interpreter, and the writer's thread, which lets the interpreter go at
every SQLite statement, waited to get it back each time: commits of a few node batches took
100-300 ms in bursts every 10 s, and the 4,096-rank ingest p99 was 160-410 ms where it is 33
ms with no analysis (benchmarks/HISTORY.md, 2026-12-07). In a process of its own the
analysis runs on the other core and never holds the writer's interpreter.

The process opens its own SQLite connection (WAL: it reads beside the writer), analyzes
every PASS_INTERVAL seconds, and sends each pass's removals to the worker over a socket pair
(framing.py); the worker's writer applies them between commits (Retention.run_slices) and
answers once the last is committed: only then does the next pass begin, as it must read what
they wrote. The process leaves when the worker is gone (its end of the pair closes); a
process that dies is started again once the removals it sent are applied.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from .framing import Frames, frame
from .retention import Retention

log = logging.getLogger("jupyter_dlc.launcher")

DRAINED = "drained"
RESTART_PAUSE = 1.0  # seconds before a dead analysis is started again (no tight crash loop)


def _receive(sock: socket.socket, frames: Frames) -> list[Any] | None:
    """The next messages; None once the other end is gone."""
    try:
        data = sock.recv(1 << 20)
    except OSError:
        data = b""
    return frames.feed(data) if data else None


def analyze_forever(retention: Retention, sock: socket.socket) -> None:
    """The analysis process's loop; returns when the worker is gone."""
    frames = Frames()
    closing = select.poll()
    closing.register(sock, select.POLLIN)
    again = False
    while True:
        # The worker sends nothing unasked: the socket turning readable is its end closing.
        if not again and closing.poll(retention.interval * 1000):
            if _receive(sock, frames) is None:
                return
        started = time.monotonic()
        again, removals = retention.analyze()
        if removals:
            try:
                sock.sendall(frame(removals))
            except OSError:
                return
            while True:  # until the worker committed the last of them
                messages = _receive(sock, frames)
                if messages is None:
                    return
                if DRAINED in messages:
                    break
        if again:
            # A job is still over its cap: analyze again at once, after a pause as long as the
            # analysis took, so that this process never takes more than half a core.
            time.sleep(time.monotonic() - started)


class AnalysisProcess:
    """The ingest worker's handle on the analysis: started at once, again if it dies; its
    removals are queued on `retention` (the writer's side) as they arrive."""

    def __init__(self, retention: Retention, db_path: str):
        self.retention = retention
        self.db_path = db_path
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._start()
        threading.Thread(target=self._receive_forever, name="dlc-retention-in", daemon=True).start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dlc.launcher.retention_process",
             "--fd", str(theirs.fileno()), "--db", self.db_path,
             "--policy", pickle.dumps(self.retention.policy).hex(),
             "--interval", repr(self.retention.interval)],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours

    @staticmethod
    def _drained(sock: socket.socket) -> None:
        # Only the writer's thread calls it, one pass's removals at a time: no lock.
        try:
            sock.sendall(frame(DRAINED))
        except OSError:
            pass  # that analysis is gone; its successor starts once the queue is empty

    def _receive_forever(self) -> None:
        while True:
            sock = self.sock
            assert sock is not None and self.process is not None
            frames = Frames()
            drained = functools.partial(self._drained, sock)
            while (messages := _receive(sock, frames)) is not None:
                for removals in messages:
                    self.retention.queue(removals, drained)
            sock.close()
            self.process.kill()
            code = self.process.wait()
            log.error("the metrics retention analysis ended (exit %s); starting another", code)
            time.sleep(RESTART_PAUSE)
            # What it chose is applied first: a new analysis reads what that wrote.
            while self.retention.pending():
                time.sleep(0.1)
            self._start()


def main() -> int:
    import argparse

    from .store import Store

    parser = argparse.ArgumentParser(prog="python -m jupyter_dlc.launcher.retention_process")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--policy", required=True, help="the retention policy, pickled, hex")
    parser.add_argument("--interval", type=float, required=True, help="seconds between passes")
    args = parser.parse_args()
    # Ctrl-C in the launcher's terminal reaches the whole group: the launcher decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s retention: %(message)s")
    # No disk guard: the worker's writer, which owns the reserve, does the writes that matter.
    store = Store(args.db, None)
    retention = Retention(store, pickle.loads(bytes.fromhex(args.policy)), interval=args.interval)
    code = 0  # the worker is gone: nothing failed
    try:
        analyze_forever(retention, socket.socket(fileno=args.fd))
    except BaseException:  # noqa: BLE001 - said here; the worker starts another
        log.exception("the metrics retention analysis failed")
        code = 1  # the worker's log says "ended (exit 1)"
    # Gone without closing SQLite, as a killed worker goes: the last connection to close
    # checkpoints the WAL into the database, which would then hold what a killed launcher
    # never committed there itself (a WAL lost under a running launcher would be found
    # whole again: tests/test_identity.py).
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
