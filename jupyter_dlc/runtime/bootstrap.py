"""Wraps every rank: `torchrun ... -m jupyter_dlc.runtime.bootstrap SCRIPT [ARGS]`.

It gives each rank its own log file (torchrun only knows local ranks), records the rank's
pid and exit, and a structured error record with the time of the first exception (for
first-error diagnosis), both as report events (`layout.RECORD_EVENTS`) and, where the
engine shares the job directory, in files the launcher reads even across its restart; and leaves
with `os._exit` once the process group is destroyed: multi-node gloo workers often crash in
interpreter shutdown, which would turn a finished job into a failed or hung one.

Stdlib only, and nothing heavy at import: this sits on every rank's launch path.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
import traceback
from typing import NoReturn

from .. import layout
from ..shims.python_private import run_exit_handlers

EXIT_HANDLERS_SECONDS = 600.0
FAILED_EXIT_HANDLERS_SECONDS = 5.0
# How long a leaving rank tries to hand its end record to the launcher: briefly where the
# record is also on disk, longer where the report route is its only way.
SEND_SECONDS = 2.0
REPORT_ONLY_SEND_SECONDS = 15.0
# How long a leaving rank waits for its log keeper to write its last output.
LOG_DRAIN_SECONDS = 2.0


def _run_exit_handlers() -> None:
    try:
        run_exit_handlers()
    except Exception:
        pass


def _write_json(path: str, data: dict) -> None:
    try:
        layout.write_json(path, data)
    except OSError:
        # A full disk (write_atomic removed its temp file): the record still goes over the
        # report route, and the rank (or its exit code) must not change for want of a file.
        pass


def _redirect_output(log_path: str) -> int | None:
    """The rank's stdout and stderr (by file descriptor: C code and child processes too) go
    to its log: through a pipe to a log keeper, a forked process that caps the log
    (layout.CappedLog: its head and a rolling tail), or straight to the file without a cap.
    Returns the keeper's pid."""
    cap = layout.log_cap()
    if not cap:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _point_output_at(fd)
        return None
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the keeper: nothing here but reading the pipe and writing the log
        try:
            _keep_log(read_end, write_end, log_path, cap)
        finally:
            os._exit(0)
    os.close(read_end)
    _point_output_at(write_end)
    return pid


def _point_output_at(fd: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _keep_log(read_end: int, write_end: int, log_path: str, cap: int) -> None:
    # A stop's SIGTERM is for the rank: the keeper leaves when the last writer is gone (the
    # rank and whatever it started), having written all they said.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.close(write_end)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # Nothing else the rank holds stays open here (an agent's pipe must see its EOF).
    os.closerange(3, read_end)
    os.closerange(read_end + 1, 1 << 16)
    log = layout.CappedLog(log_path, cap)
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        log.write(chunk)
    log.close()


def _log_written(keeper: int | None) -> None:
    """Before the rank's end is recorded (after which the launcher may read its log, or kill
    what is left): hand the keeper the last output and let it write it, briefly."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if keeper is None:
            return
        _point_output_at(os.open(os.devnull, os.O_WRONLY))
        deadline = time.monotonic() + LOG_DRAIN_SECONDS
        while time.monotonic() < deadline:
            # Still running while a child of the rank holds the pipe: it goes on without us.
            if os.waitpid(keeper, os.WNOHANG)[0]:
                return
            time.sleep(0.005)
    except (OSError, ValueError):
        pass


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group must not change how the rank exits
        pass


class _Records:
    """This rank's records: its start (pid, node), its end (exit code) and its first error.

    They go to the launcher over the report route, so that no engine needs a filesystem
    shared with the launcher for them; where the ranks do share the job directory (the local
    engine's fast path) they are also written there, as files the launcher reads even after
    it was down. An engine that sets DLC_RANK_RECORDS=report gets the route alone."""

    def __init__(self, rank: int, attempt_dir: str | None):
        self.report_only = os.environ.get(layout.RECORDS_ENV) == "report"
        self.attempt_dir = attempt_dir if attempt_dir and not self.report_only else None
        self.path = os.path.join(self.attempt_dir, f"rank-{rank}.json") if self.attempt_dir else None
        self.record: dict = {
            "rank": rank,
            "node": int(os.environ.get("GROUP_RANK", os.environ.get("DLC_NODE_RANK", "0"))),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "pid": os.getpid(),
            "start": time.time(),
        }
        self.pending: list[dict] = []
        # With files on disk the route only copies them: a launcher that is down must not
        # hold the rank's exit up for long. Without, it is the only record: wait longer.
        self.send_seconds = REPORT_ONLY_SEND_SECONDS if self.report_only else SEND_SECONDS

    def started(self) -> None:
        if self.path:
            _write_json(self.path, self.record)
        if self.report_only:
            # The launcher learns the rank is up (its pid) from this; off the script's path.
            start = {"type": layout.RANK_START, **self._fields("pid", "node", "local_rank", "start")}
            threading.Thread(target=_send, args=([start], self.send_seconds), daemon=True).start()

    def failed(self, error: BaseException, text: str) -> None:
        first = {"t": time.time(), "rank": self.record["rank"], "node": self.record["node"],
                 "type": type(error).__name__, "message": str(error)[:2000], "traceback": text[-20000:]}
        if self.attempt_dir:
            _write_json(os.path.join(self.attempt_dir, f"rank-{self.record['rank']}.error.json"), first)
        event = {"type": layout.RANK_ERROR, "t": first["t"], "node": first["node"],
                 "error": first["type"][:200], "message": first["message"][:layout.RECORD_TEXT],
                 "traceback": text[-layout.RECORD_TEXT:]}
        # On its way at once where the runtime's reporter runs (a peer's failure is what
        # the launcher's verdict on a killed rank waits for: recovery starts here), not after
        # the exit handlers; else with the end record.
        if not _queue([event]):
            self.pending.append(event)

    def ended(self, exit_code: int) -> None:
        self.record.update(end=time.time(), exit_code=exit_code)
        end = {"type": layout.RANK_END, **self._fields("pid", "node", "local_rank", "start",
                                                        "end", "exit_code")}
        # Sent before the file is written: once the launcher learns of the exit (from the
        # file, or the agent after this process is gone) it may kill what is left of the
        # attempt, this process included, and the copy on the route would be cut short.
        _send(self.pending + [end], self.send_seconds)
        self.pending = []
        if self.path:
            _write_json(self.path, self.record)

    def _fields(self, *names: str) -> dict:
        return {name: self.record[name] for name in names}


def _queue(events: list[dict]) -> bool:
    try:
        from .report import queue_events_now

        return queue_events_now(events)
    except Exception:  # noqa: BLE001 - a record that cannot be sent must not change the exit
        return False


def _send(events: list[dict], seconds: float) -> None:
    try:
        from .report import send_events_now

        send_events_now(events, seconds)
    except Exception:  # noqa: BLE001 - a record that cannot be sent must not change the exit
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m jupyter_dlc.runtime.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    attempt_dir = os.environ.get("DLC_ATTEMPT_DIR")
    keeper = _redirect_output(layout.rank_log(attempt_dir, rank)) if attempt_dir else None
    records = _Records(rank, attempt_dir)
    records.started()
    _record_os_exit(records, keeper)

    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    exit_code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException as error:  # noqa: BLE001 - every failure must be recorded
        exit_code = 1
        text = traceback.format_exc()
        sys.stderr.write(text)
        records.failed(error, text)
    # atexit handlers (the runtime's last report and checkpoint commit, user hooks) would be
    # skipped by os._exit. After a failure they get a short while only: a commit waiting for
    # ranks that are gone must not keep this rank, and so the whole job, from ending.
    runner = threading.Thread(target=_run_exit_handlers, daemon=True)
    runner.start()
    runner.join(EXIT_HANDLERS_SECONDS if exit_code == 0 else FAILED_EXIT_HANDLERS_SECONDS)
    if exit_code == 0:
        _destroy_process_group()
    _log_written(keeper)
    records.ended(exit_code)
    _REAL_OS_EXIT(exit_code)


_REAL_OS_EXIT = os._exit


def _record_os_exit(records: _Records, keeper: int | None = None) -> None:
    """A script that leaves with `os._exit(code)` (as multi-node gloo scripts must, see
    FIELD-NOTES) skips everything after it: record its exit code first. Otherwise the
    launcher sees a rank gone without a record and has to guess between a clean exit and a
    kill from its agent's verdict, which a loaded machine can delay past any grace."""
    def recorded_exit(status: int) -> NoReturn:
        if os.getpid() == records.record["pid"]:  # not a forked child (a DataLoader worker)
            try:
                _log_written(keeper)
                records.ended(int(status))
            except (OSError, TypeError, ValueError):
                pass
        _REAL_OS_EXIT(status)

    os._exit = recorded_exit


if __name__ == "__main__":
    main(sys.argv[1:])
