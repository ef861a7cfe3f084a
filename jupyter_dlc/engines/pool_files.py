"""A warm pool's files: start a pool's node agents here, hand one a job, see that it is ready,
release it.

A pool is a directory `<data_dir>/pools/<pool id>/gen-N/` and one zygote per node
(`node/pool_agent.py`); this module is the launcher's side of that file protocol, shared by
every engine's pool driver (`local/pool.py`, `slurm/pool.py`: the agents run here or on
Slurm's nodes, and read the same files). What a pool is for, and when one starts or goes, is
the launcher's policy (`launcher/pools.py`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from .. import hostprocs, layout
from . import children
from .contract import AttemptContext
from .torchrun import torchrun_argv

ACK_TIMEOUT = 10.0  # seconds for a zygote to fork a job's node process (it polls each 10 ms)
# Room in each agent's exec'd environment for a job's markers (see pool_agent).
ROOM = "x" * 256


def pool_id(cluster: str | None, nodes: int, nproc: int) -> str:
    return f"{cluster or 'local'}-{nodes}x{nproc}"


# How long a job waits for the leftovers of the pool's last (ended) job to be gone.
LEFTOVER_WAIT = 2.0


def start_agents(pool_dir: str, nodes: int, env: dict[str, str], python: str | None = None) -> list[int]:
    """Start one zygote per node, each in a session of its own (it outlives a launcher)."""
    os.makedirs(pool_dir, exist_ok=True)
    touch_lease(pool_dir)
    agent_env = dict(env, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
                     DLC_POOL_DIR=os.path.abspath(pool_dir), DLC_POOL_ROOM=ROOM, PYTHONUNBUFFERED="1")
    agent_env.pop("DLC_JOB_ID", None)
    pids = []
    for node in range(nodes):
        with open(os.path.join(pool_dir, f"agent-{node}.log"), "ab") as log:
            proc = subprocess.Popen([python or sys.executable, "-m", "jupyter_dlc.node.pool_agent",
                                     pool_dir, str(node)], cwd=pool_dir, env=agent_env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True,
                                    # Read now: the launcher sets it after this module is imported.
                                    umask=children.CHILD_UMASK)
        pids.append(children.detach(proc))  # reaped by the supervisor's tick (children.py)
    return pids


def touch_lease(pool_dir: str) -> None:
    path = os.path.join(pool_dir, "lease")
    try:
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError:
        pass


def agent_pids(pool_dir: str, nodes: int, here: bool = True) -> list[int | None]:
    """Each node agent's pid once it is ready (torch imported), None where not (yet). Only
    agents `here` (on this machine) are also checked to be alive: another host's pids mean
    nothing here (a Slurm pool's liveness is its allocation's, launcher/pools.py)."""
    pids: list[int | None] = []
    for node in range(nodes):
        info = layout.read_json(os.path.join(pool_dir, f"node-{node}.pid")) or {}
        pid = info.get("pid")
        pids.append(pid if pid and (not here or hostprocs.alive(pid)) else None)
    return pids


def keeper_pid(pool_dir: str, here: bool = True) -> int | None:
    pid = (layout.read_json(os.path.join(pool_dir, "node-0.pid")) or {}).get("keeper")
    return pid if pid and (not here or hostprocs.alive(pid)) else None


def ready(pool_dir: str, nodes: int, here: bool = True) -> bool:
    return all(agent_pids(pool_dir, nodes, here)) and keeper_pid(pool_dir, here) is not None and \
        os.path.exists(os.path.join(pool_dir, "store-ready.json"))


def release(pool_dir: str) -> None:
    """End every process of the pool (agents, store keeper, idle node processes) and remove
    its directory. A job running on it is not touched: its processes are the job's."""
    for pid in _pool_processes(os.path.abspath(pool_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(pool_dir, ignore_errors=True)


def _pool_processes(pool_dir: str) -> list[int]:
    """Processes that still carry the pool's directory in their exec'd environment: its
    agents and keeper (a job's processes have theirs overwritten with the job's markers)."""
    found = []
    marker = f"DLC_POOL_DIR={pool_dir}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry))
    return found


def broken(pool_dir: str, nodes: int, started: float, warm_within: float = 120.0,
           here: bool = True) -> bool:
    """An agent or the store keeper that was up and is gone (seen only `here`), or an agent
    that never became ready: the pool must be replaced."""
    for node in range(nodes):
        info = layout.read_json(os.path.join(pool_dir, f"node-{node}.pid"))
        if info is None:
            if time.time() - started > warm_within:
                return True
        elif not here:
            continue
        elif not hostprocs.alive(info["pid"]) or (
                node == 0 and info.get("keeper") and not hostprocs.alive(info["keeper"])):
            return True
    return False


def name_of(pool_dir: str) -> str:
    """The pool's id for a directory of its agents: each start of a pool has a directory of
    its own (`<pool id>/gen-N`, launcher/pools.py); older pools used the pool's directory."""
    base = os.path.basename(os.path.normpath(pool_dir))
    return os.path.basename(os.path.dirname(os.path.normpath(pool_dir))) if base.startswith("gen-") else base


def head_address(pool_dir: str) -> str:
    """Node 0's address, as its agent recorded it: the jobs' MASTER_ADDR."""
    return (layout.read_json(os.path.join(pool_dir, "node-0.pid")) or {}).get("addr") or "127.0.0.1"


def submit(pool_dir: str, ctx: AttemptContext, seq: int, here: bool = True) -> dict[str, Any] | None:
    """Hand attempt `ctx` to the pool's agents; the engine handle (node processes' pids) as
    a cold start's, or None if the pool did not take it (then nothing of it runs). `here`:
    the agents run on this machine, so the job's processes join the attempt's cgroup (on
    other hosts that path means nothing, and Slurm's own tracking of the step holds them)."""
    spec = ctx.spec
    store = layout.read_json(os.path.join(pool_dir, "store-ready.json")) or {}
    if store.get("seq") != seq:
        return None  # the keeper has not opened this job's store yet
    layout.write_atomic(os.path.join(pool_dir, "store-claim"), str(seq))
    argv = torchrun_argv(spec, 0, store["port"], ctx.script_path, sys.executable)
    cgroup = hostprocs.attempt_cgroup(ctx.job_id, ctx.attempt, create=True) if here else None
    os.makedirs(ctx.attempt_dir, exist_ok=True)
    for node in range(spec.nodes):
        order = {"seq": seq, "node": node, "nnodes": spec.nodes, "nproc_per_node": spec.nproc_per_node,
                 "master_addr": head_address(pool_dir), "master_port": store["port"],
                 "script": ctx.script_path, "args": argv[argv.index(ctx.script_path) + 1:],
                 "cwd": spec.workdir or ctx.job_dir, "env": ctx.env, "cgroup": cgroup,
                 "attempt_dir": ctx.attempt_dir, "node_log": layout.node_log(ctx.attempt_dir, node),
                 "exit_file": layout.node_exit(ctx.attempt_dir, node)}
        path = os.path.join(pool_dir, f"node-{node}.order")
        layout.write_json(path, order, mode=0o600)  # it holds the attempt's token
    nodes = []
    deadline = time.monotonic() + ACK_TIMEOUT
    for node in range(spec.nodes):
        while True:
            ack = layout.read_json(os.path.join(pool_dir, f"node-{node}.ack")) or {}
            if ack.get("seq") == seq:
                nodes.append({"node": node, "pid": ack["pid"]})
                break
            if time.monotonic() > deadline:
                return {"nodes": nodes, "pool": name_of(pool_dir),
                        "pool_dir": os.path.abspath(pool_dir), "broken": True}
            time.sleep(0.005)
    return {"nodes": nodes, "pool": name_of(pool_dir), "pool_dir": os.path.abspath(pool_dir),
            "submitted": time.time()}
