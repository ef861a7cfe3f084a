"""A warm pool on Slurm: a held allocation whose one step runs a pool agent per node.

`sbatch` asks once for the shape's nodes; the batch script `srun`s one zygote per node
(`pool_agent.py`, torch imported) and holds the allocation while they wait for work. A job
on the pool is handed to those agents through the pool directory, which the nodes share
with the launcher (the engine requires `shared_filesystem: true`): it runs inside the
allocation, so it skips the queue and the import. The agents leave when the launcher stops
renewing their lease, and then the step and the allocation end with them; `pool down`
cancels the allocation at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

from ... import layout, shell
from ...node.slurm_node import STEP_VARS
from ...spec import JobSpec
from .. import children
from ..contract import AttemptContext, AttemptStatus, NodeStatus, Phase, PoolDriver, RankStatus, rank_records
from .. import pool_files
from .commands import ACTIVE, POLL_INTERVAL, client_env, profile_of, run_slurm, sbatch_directives

POOL_SBATCH = """#!/bin/bash
{header}
# A warm pool of jupyter-dlc: one agent per node, holding the allocation until released.
set -u
unset SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE
srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    /bin/bash -c {task}
"""


def _shape(cluster: str, nodes: int = 1, nproc: int = 1) -> JobSpec:
    """A spec of the pool's shape on its cluster: what the Slurm engine's helpers read."""
    return JobSpec.from_dict({"code": "pass", "nodes": nodes, "nproc_per_node": nproc,
                              "cluster": cluster, "engine": "slurm"})


def start_allocation(pool_dir: str, cluster: str, nodes: int, nproc: int, env: dict[str, str],
                     python: str | None = None) -> str:
    """Submit the pool's allocation; returns its Slurm job id."""
    spec = _shape(cluster, nodes, nproc)
    profile = profile_of(spec)
    directives = sbatch_directives(spec, profile, f"dlc-pool-{pool_files.name_of(pool_dir)}",
                                   os.path.join(pool_dir, "slurm-%j.out"), pool_dir)
    python = python or profile.get("python") or sys.executable
    pool_slots = {"NODE": '"$SLURM_NODEID"'}
    agent = shell.command([python, "-m", "jupyter_dlc.node.pool_agent", pool_dir, shell.slot("NODE")],
                          pool_slots)
    agent_log = shell.word(os.path.join(pool_dir, f"agent-{shell.slot('NODE')}.log"), pool_slots)
    task = "\n".join([
        # The pool's node processes start the jobs' ranks: the user's umask, not the launcher's.
        *([f"umask {children.CHILD_UMASK:04o}"] if children.CHILD_UMASK >= 0 else []),
        f"unset {' '.join(STEP_VARS)}",
        # Node names need not resolve: each agent records its node's NodeAddr (the head's is
        # the jobs' MASTER_ADDR).
        'export DLC_POOL_ADDR="$(scontrol show node "$SLURMD_NODENAME" | '
        "sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | head -n1)\"",
        f"exec {agent} >> {agent_log} 2>&1",
    ])
    script = POOL_SBATCH.format(header="\n".join(f"#SBATCH {line}" for line in directives),
                                nodes=nodes, task=shell.quote(task))
    path = os.path.join(pool_dir, "pool.sbatch")
    with open(path, "w") as f:
        f.write(script)
    submit_env = dict(client_env(profile), **env, DLC_POOL_ENGINE="slurm")
    out = run_slurm(["sbatch", "--parsable", "--export=ALL", path], submit_env, check=True).stdout
    return out.strip().split(";")[0]


def allocation_state(cluster: str, engine_id: str) -> str:
    """squeue's state of the allocation (PENDING, RUNNING, ...), or GONE."""
    result = run_slurm(["squeue", "-h", "-j", engine_id, "-o", "%T"], client_env(profile_of(_shape(cluster))))
    state = result.stdout.strip() if result.returncode == 0 else ""
    return state or "GONE"


def cancel(cluster: str, engine_id: str) -> None:
    try:
        run_slurm(["scancel", engine_id], client_env(profile_of(_shape(cluster))))
    except (RuntimeError, subprocess.SubprocessError):
        pass  # Slurm unreachable: the agents' lease ends the allocation anyway


# -- a job on the pool, seen and stopped without the launcher's /proc or signals -----------
# The pool's nodes may be other hosts: the launcher neither sees their pids nor can signal
# them. Each node process (pool_agent.run_node) owns its ranks, records their exits in the
# shared attempt directory and carries out the TERM/KILL orders left there; the ranks report
# their own records over the report route; Slurm says whether the allocation still holds.
NODE_STALE = 30.0  # seconds without a node process's sign of life before its node is lost
_states: dict[str, tuple[float, str]] = {}  # allocation -> (when asked, squeue's state)


def polled_state(cluster: str, engine_id: str, fresh: bool = False) -> str:
    """The allocation's state, asked of Slurm at most once a POLL_INTERVAL (`fresh`: now)."""
    asked, state = _states.get(engine_id, (0.0, ""))
    if fresh or time.monotonic() - asked >= POLL_INTERVAL:
        state = allocation_state(cluster, engine_id)
        _states[engine_id] = (time.monotonic(), state)
    return state


def allocation_held(state: str) -> bool:
    return ACTIVE.get(state) is not None and state != "COMPLETING"


def _node_host(ctx: AttemptContext, handle: dict, node: int) -> str:
    alive = layout.read_json(os.path.join(ctx.attempt_dir, f"node-{node}.alive")) or {}
    agent = layout.read_json(os.path.join(handle.get("pool_dir", ""), f"node-{node}.pid")) or {}
    return alive.get("host") or agent.get("host") or agent.get("addr") or "?"


def _lost(ctx: AttemptContext, handle: dict, waiting: list[int], failing: list[int]) -> str | None:
    """Why the nodes still without an exit record will never write one, or why the failing
    ones failed when Slurm took the allocation (a scancel's SIGTERM ends ranks too), or None."""
    allocation = handle.get("allocation")
    state = polled_state(ctx.spec.cluster or "", allocation, fresh=bool(failing)) if allocation else "GONE"
    node = (waiting or failing)[0]
    if not allocation_held(state):
        return (f"pool {handle['pool']} lost node {node} ({_node_host(ctx, handle, node)}): "
                f"its allocation {allocation} is {state}")
    for node in waiting:
        silent = silent_for(ctx.attempt_dir, node, handle.get("submitted"))
        if silent > NODE_STALE:
            return (f"pool {handle['pool']} lost node {node} ({_node_host(ctx, handle, node)}): "
                    f"no sign of its node process for {silent:.0f}s")
    return None


def silent_for(attempt_dir: str, node: int, since: float | None = None) -> float:
    """Seconds since the node process of `node` last showed it is alive (or since `since`,
    else the attempt directory's creation, when it never did)."""
    try:
        seen = os.stat(os.path.join(attempt_dir, f"node-{node}.alive")).st_mtime
    except OSError:
        try:
            seen = since or os.stat(attempt_dir).st_mtime
        except OSError:
            return float("inf")
    return time.time() - seen


def nodes_left(attempt_dir: str, nodes: int) -> list[int]:
    """Nodes of an attempt whose node process may still run: no exit recorded, and a sign
    of life within NODE_STALE."""
    return [n for n in range(nodes) if not os.path.exists(layout.node_exit(attempt_dir, n))
            and silent_for(attempt_dir, n) <= NODE_STALE]


def describe_job(ctx: AttemptContext, handle: dict) -> AttemptStatus:
    nodes = ctx.spec.nodes
    exits = {n: layout.read_int(layout.node_exit(ctx.attempt_dir, n)) for n in range(nodes)}
    records = rank_records(ctx)
    waiting = [n for n, code in exits.items() if code is None]
    failing = [n for n, code in exits.items() if code] or \
        sorted({r // ctx.spec.nproc_per_node for r, rec in records.items() if rec.get("exit_code")})
    status = AttemptStatus()
    lost = _lost(ctx, handle, waiting, failing) if waiting or failing else None
    status.phase = Phase.RUNNING if waiting and not lost else Phase.ENDED
    status.alive = status.phase == "RUNNING"
    status.reason = lost
    for node, code in exits.items():
        status.nodes.append(NodeStatus(node, status.alive and code is None, code))
    for rank, record in records.items():
        code = record.get("exit_code")
        if code is None and exits[rank // ctx.spec.nproc_per_node] == 0:
            code = 0  # left with os._exit before its record; its node process saw it exit 0
        running = code is None and record.get("pid") is not None and status.alive
        status.ranks[rank] = RankStatus(rank, record.get("pid"), running, code,
                                        record.get("start"), record.get("end"))
    return status


def order_job(ctx: AttemptContext, what: str) -> None:
    """Leave TERM or KILL for each node process of the attempt (pool_agent.run_node)."""
    for node in range(ctx.spec.nodes):
        layout.write_json_atomic(os.path.join(ctx.attempt_dir, f"node-{node}.signal"), {"signal": what})


class SlurmPoolDriver(PoolDriver):
    """A pool that is a held Slurm allocation: its agents run on the allocation's nodes
    (other hosts, as far as the launcher knows), so it is watched through the shared pool
    and attempt directories and squeue, and stopped with orders and scancel."""

    def start(self, directory: str, record: dict[str, Any], env: dict[str, str]) -> str | None:
        env = dict(env, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1",
                   DLC_POOL_DIR=os.path.abspath(directory), DLC_POOL_ROOM=pool_files.ROOM)
        pool_files.touch_lease(directory)
        return start_allocation(directory, record["cluster"], record["nodes"], record["nproc_per_node"], env)

    def broken(self, directory: str, record: dict[str, Any]) -> str | None:
        if not record.get("engine_id"):
            return "holds no allocation"
        state = polled_state(record["cluster"], record["engine_id"])
        return None if allocation_held(state) else f"its allocation {record['engine_id']} is {state}"

    def job_left(self, record: dict[str, Any], snapshot: dict, ended: bool) -> bool:
        """Every node process of the last job recorded its exit in the shared attempt
        directory or fell silent (lost, its ranks with it), or the allocation is gone."""
        attempt_dir = record.get("attempt_dir")
        if not attempt_dir or not nodes_left(attempt_dir, record.get("job_nodes", record["nodes"])):
            return True
        return self.broken("", record) is not None

    def kill_job(self, ctx: AttemptContext) -> None:
        order_job(ctx, "KILL")

    def release(self, directory: str, record: dict[str, Any]) -> None:
        # The agents and the store keeper are the allocation's step: scancel ends them
        # wherever they run, in their own time (a replacement starts in a directory of its
        # own meanwhile: launcher/pools.py).
        if record.get("engine_id"):
            cancel(record["cluster"], record["engine_id"])
        shutil.rmtree(directory, ignore_errors=True)
