"""A standby torchrun agent: pays torchrun's start-up (importing torch) ahead of need.

While attempt N runs, the launcher starts one of these per node for attempt N + 1, with that
attempt's environment (so it is found, and cleaned up, like every process of the job). It
imports torch and what ranks import on first use, then forks one waiting rank process per
local rank (warm_ranks.py). If attempt N fails, the launcher writes the go file with the
agent's argv and the last variables (resume path); the standby becomes the agent at once,
and its workers are those forked ranks: no interpreter start and no torch import on the
restart path. If attempt N ends otherwise, the launcher kills it; and should no launcher ever
come back, it leaves by itself once attempt N has no process left.

    python -m jupyter_dlc.node.standby GO_FILE EXIT_FILE
    python -m jupyter_dlc.node.standby --cold EXIT_FILE -m torch.distributed.run ARGS...

The second form is how every engine starts a node of an attempt that has no standbys or
pool (engines/torchrun.py node_agent_argv; Kubernetes wraps its own torchrun line): torchrun's
own command line behind `--cold EXIT_FILE` (what `--dry-run` prints is what runs), no go file
to wait for. The node's one agent imports torch and what DDP's first construction imports,
then forks its ranks, so a node pays one torch import rather than one per rank plus the
agent's. It preloads only what a rank is sure to need (COLD_PRELOAD): that import is on the
job's path, not ahead of it.

GO_FILE.ready appears once it is warm; it holds the number of ranks it forked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

_POLL = 0.01
COLD = "--cold"
TORCHRUN = ("-m", "torch.distributed.run")
# How long a node other than 0 waits for node 0's agent to listen before starting its own.
_MASTER_WAIT = 5.0
_ORPHAN_CHECK = 2.0
# Longer than the launcher's longest restart backoff (60 s), with room for a launcher restart.
_ORPHAN_AFTER = 120.0


def _attempt_alive(job_id: str, attempt: int) -> bool:
    from ..hostprocs import job_processes

    return bool(job_processes().get((job_id, attempt)))


def _await_master(args: list[str]) -> None:
    """On a node other than 0: return once node 0's agent listens on the master port (or
    after _MASTER_WAIT). Both standbys get their go at once, and an agent that finds the port
    closed backs off inside torch's store client (~0.1-1 s) rather than retrying at once."""
    options = {}
    for arg in args:
        if not arg.startswith("--"):
            break  # torchrun's options end where the program (`-m ...`, the script) begins
        name, _, value = arg[2:].partition("=")
        options[name] = value
    if options.get("node-rank", "0") == "0" or not options.get("master-port"):
        return
    address = (options.get("master-addr") or "127.0.0.1", int(options["master-port"]))
    deadline = time.monotonic() + _MASTER_WAIT
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.002)


def main(go_file: str | None, exit_file: str, cold_args: list[str] | None = None) -> int:
    """Warm up, then run torchrun's agent with `cold_args` at once (a cold start), or with
    the arguments a go file brings (a standby)."""
    import torch.distributed.run as torchrun  # the cost this process exists to pay early

    from . import warm_ranks

    warm_ranks.preload(warm_ranks.PRELOAD if go_file else warm_ranks.COLD_PRELOAD)
    ranks = warm_ranks.fork_ranks(int(os.environ.get("DLC_NPROC_PER_NODE", "0") or 0))
    order: dict[str, Any] | None = ({"args": cold_args or [], "env": {}} if go_file is None
                                    else _wait_for_go(go_file, len(ranks)))
    if order is None:
        return 0  # attempt N is long gone and nobody sent us: no launcher is coming
    os.environ.update(order["env"])
    warm_ranks.route(ranks)
    _await_master(order["args"])
    code = 1
    try:
        torchrun.main(order["args"])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - torchrun's ChildFailedError and the like
        import traceback

        traceback.print_exc()
    finally:
        with open(exit_file, "w") as f:
            f.write(str(code))
    return code


def _wait_for_go(go_file: str, forked: int) -> dict[str, Any] | None:
    """The go file's order once it comes; None when attempt N left and nobody sent one."""
    # For views and tests: this node's standby is warm, with this many forked ranks.
    with open(f"{go_file}.ready", "w") as f:
        f.write(str(forked))
    job_id = os.environ["DLC_JOB_ID"]
    previous = int(os.environ["DLC_ATTEMPT"]) - 1
    next_check = time.monotonic() + _ORPHAN_CHECK
    last_seen = time.monotonic()
    while not os.path.exists(go_file):
        time.sleep(_POLL)
        if time.monotonic() > next_check:
            if _attempt_alive(job_id, previous):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen > _ORPHAN_AFTER:
                return None
            next_check = time.monotonic() + _ORPHAN_CHECK
    with open(go_file) as f:
        order = json.load(f)
    os.unlink(go_file)  # it holds the attempt's job token: no copy of it stays on disk
    return order


def cold_argv(torchrun_argv: list[str], exit_file: str) -> list[str]:
    """A node's torchrun command line (`python -m torch.distributed.run ARGS`) as a cold
    start's agent: the same arguments, behind `-m jupyter_dlc.node.standby --cold EXIT_FILE`."""
    python, *rest = torchrun_argv
    assert tuple(rest[:2]) == TORCHRUN, torchrun_argv
    return [python, "-m", "jupyter_dlc.node.standby", COLD, exit_file, *rest]


if __name__ == "__main__":
    sys.stdout.flush()
    if sys.argv[1:2] == [COLD]:
        if tuple(sys.argv[3:5]) != TORCHRUN:
            print("usage: python -m jupyter_dlc.node.standby --cold EXIT_FILE -m torch.distributed.run ARGS...",
                  file=sys.stderr)
            os._exit(2)
        os._exit(main(None, sys.argv[2], sys.argv[5:]))
    os._exit(main(sys.argv[1], sys.argv[2]))
