"""The processes the launcher starts and does not wait for itself (node agents, standby
agents, pool zygotes: they run in sessions of their own and may outlive it), reaped by pid.

Not with `waitpid(-1)`: that collects the exit of any child, also one another thread
started and waits for (a stop's `scancel`, an `ssh` to a host), which `subprocess` then
reports as exit 0, so a failed scancel would read as done. Only the pids handed over here
are waited for; every other child stays its starter's.
"""

from __future__ import annotations

import os
import subprocess
import threading

_lock = threading.Lock()
_pids: set[int] = set()


def detach(proc: subprocess.Popen) -> int:
    """Hand a started process over to the supervisor's reaping; returns its pid. The Popen
    object is dropped by the caller: marked done, its destructor does not warn of a live child."""
    with _lock:
        _pids.add(proc.pid)
    proc.returncode = 0
    return proc.pid


def reap() -> list[int]:
    """Collect the exit of every handed-over process that ended (no zombie stays); returns
    their pids."""
    with _lock:
        pids = list(_pids)
    gone = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already collected: nothing left to wait for
            done = pid
        if done:
            gone.append(pid)
    with _lock:
        _pids.difference_update(gone)
    return gone
