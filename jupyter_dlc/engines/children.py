"""The processes the launcher starts and does not wait for itself (node agents, standby
agents, pool zygotes: they run in sessions of their own and may outlive it): started by
`spawn` (in the attempt's cgroup, with the job's umask), reaped by pid.

Not with `waitpid(-1)`: that collects the exit of any child, also one another thread
started and waits for (a stop's `scancel`, an `ssh` to a host), which `subprocess` then
reports as exit 0, so a failed scancel would read as done. Only the pids handed over here
are waited for; every other child stays its starter's.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import TYPE_CHECKING

from .. import layout
from ..hostprocs import attempt_cgroup

if TYPE_CHECKING:
    from .contract import AttemptContext

# The umask a job's processes run with: the one the launcher was started with (the launcher
# itself runs with 077), so that a job's own outputs get the modes its user expects.
CHILD_UMASK = -1

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


def spawn(ctx: AttemptContext, node: int, argv: list[str]) -> int:
    """Start one node's process in a session of its own (it must outlive the launcher),
    its output appended to the node's log; returns its pid."""
    cgroup = attempt_cgroup(ctx.job_id, ctx.attempt, create=True)
    if cgroup:
        # The process joins the attempt's cgroup before it runs anything; what it starts is
        # born inside. (A shell, not preexec_fn: the launcher has threads.)
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" 2>/dev/null; exec "$@"',
                os.path.join(cgroup, "cgroup.procs"), *argv]
    with open(layout.node_log(ctx.attempt_dir, node), "ab") as log:
        proc = subprocess.Popen(argv, cwd=ctx.spec.workdir or ctx.job_dir,
                                env=dict(ctx.env, DLC_NODE_RANK=str(node)),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, umask=CHILD_UMASK)
    return detach(proc)  # reaped by the supervisor's tick (children.py)
