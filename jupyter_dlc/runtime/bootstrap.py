"""Wraps every rank: `torchrun ... -m jupyter_dlc.runtime.bootstrap SCRIPT [ARGS]`.

It gives each rank its own log file (torchrun only knows local ranks), records the rank's
pid and exit in files the launcher reads even after a launcher restart, writes a structured
error record with the time of the first exception (for first-error diagnosis), and leaves
with `os._exit` once the process group is destroyed: multi-node gloo workers often crash in
interpreter shutdown, which would turn a finished job into a failed or hung one.

Stdlib only, and nothing heavy at import: this sits on every rank's launch path.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
import traceback
from typing import NoReturn

from ..shims.python_private import run_exit_handlers

EXIT_HANDLERS_SECONDS = 600.0
FAILED_EXIT_HANDLERS_SECONDS = 5.0


def _run_exit_handlers() -> None:
    try:
        run_exit_handlers()
    except Exception:
        pass


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group must not change how the rank exits
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m jupyter_dlc.runtime.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    attempt_dir = os.environ.get("DLC_ATTEMPT_DIR")
    record: dict = {
        "rank": rank,
        "node": int(os.environ.get("GROUP_RANK", os.environ.get("DLC_NODE_RANK", "0"))),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "pid": os.getpid(),
        "start": time.time(),
    }
    record_path = None
    if attempt_dir:
        _redirect_output(os.path.join(attempt_dir, f"rank-{rank}.log"))
        record_path = os.path.join(attempt_dir, f"rank-{rank}.json")
        _write_json(record_path, record)

    if record_path:
        _record_os_exit(record, record_path)

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
        if attempt_dir:
            _write_json(os.path.join(attempt_dir, f"rank-{rank}.error.json"), {
                "t": time.time(), "rank": rank, "node": record["node"],
                "type": type(error).__name__, "message": str(error)[:2000], "traceback": text[-20000:],
            })
    # atexit handlers (the runtime's last report and checkpoint commit, user hooks) would be
    # skipped by os._exit. After a failure they get a short while only: a commit waiting for
    # ranks that are gone must not keep this rank, and so the whole job, from ending.
    runner = threading.Thread(target=_run_exit_handlers, daemon=True)
    runner.start()
    runner.join(EXIT_HANDLERS_SECONDS if exit_code == 0 else FAILED_EXIT_HANDLERS_SECONDS)
    if exit_code == 0:
        _destroy_process_group()
    if record_path:
        record.update(end=time.time(), exit_code=exit_code)
        _write_json(record_path, record)
    sys.stdout.flush()
    sys.stderr.flush()
    _REAL_OS_EXIT(exit_code)


_REAL_OS_EXIT = os._exit


def _record_os_exit(record: dict, record_path: str) -> None:
    """A script that leaves with `os._exit(code)` (as multi-node gloo scripts must, see
    FIELD-NOTES) skips everything after it: record its exit code first. Otherwise the
    launcher sees a rank gone without a record and has to guess between a clean exit and a
    kill from its agent's verdict, which a loaded machine can delay past any grace."""
    def recorded_exit(status: int) -> NoReturn:
        if os.getpid() == record["pid"]:  # not a forked child (a DataLoader worker) leaving
            try:
                record.update(end=time.time(), exit_code=int(status))
                _write_json(record_path, record)
            except (OSError, TypeError, ValueError):
                pass
        _REAL_OS_EXIT(status)

    os._exit = recorded_exit


if __name__ == "__main__":
    main(sys.argv[1:])
