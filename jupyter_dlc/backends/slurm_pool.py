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
import shlex
import subprocess
import sys

from ..spec import JobSpec
from .slurm import STEP_VARS, _profile, _run, client_env, sbatch_directives

POOL_SBATCH = """#!/bin/bash
{header}
# A warm pool of jupyter-dlc: one agent per node, holding the allocation until released.
set -u
unset SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE
srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 \\
    /bin/bash -c {task}
"""


def _shape(cluster: str, nodes: int = 1, nproc: int = 1) -> JobSpec:
    """A spec of the pool's shape on its cluster: what the Slurm engine's helpers read."""
    return JobSpec.from_dict({"code": "pass", "nodes": nodes, "nproc_per_node": nproc,
                              "cluster": cluster, "backend": "slurm"})


def start_allocation(pool_dir: str, cluster: str, nodes: int, nproc: int, env: dict[str, str],
                     python: str | None = None) -> str:
    """Submit the pool's allocation; returns its Slurm job id."""
    spec = _shape(cluster, nodes, nproc)
    profile = _profile(spec)
    directives = sbatch_directives(spec, profile, f"dlc-pool-{os.path.basename(pool_dir)}",
                                   os.path.join(pool_dir, "slurm-%j.out"), pool_dir)
    python = python or profile.get("python") or sys.executable
    task = "\n".join([
        f"unset {' '.join(STEP_VARS)}",
        # Node names need not resolve: each agent records its node's NodeAddr (the head's is
        # the jobs' MASTER_ADDR).
        'export DLC_POOL_ADDR="$(scontrol show node "$SLURMD_NODENAME" | '
        "sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | head -n1)\"",
        f'exec {shlex.quote(python)} -m jupyter_dlc.backends.pool_agent {shlex.quote(pool_dir)} '
        f'"$SLURM_NODEID" >> {shlex.quote(pool_dir)}/agent-"$SLURM_NODEID".log 2>&1',
    ])
    script = POOL_SBATCH.format(header="\n".join(f"#SBATCH {line}" for line in directives),
                                nodes=nodes, task=shlex.quote(task))
    path = os.path.join(pool_dir, "pool.sbatch")
    with open(path, "w") as f:
        f.write(script)
    submit_env = dict(client_env(profile), **env, DLC_POOL_ENGINE="slurm")
    out = _run(["sbatch", "--parsable", "--export=ALL", path], submit_env, check=True).stdout
    return out.strip().split(";")[0]


def allocation_state(cluster: str, engine_id: str) -> str:
    """squeue's state of the allocation (PENDING, RUNNING, ...), or GONE."""
    result = _run(["squeue", "-h", "-j", engine_id, "-o", "%T"], client_env(_profile(_shape(cluster))))
    state = result.stdout.strip() if result.returncode == 0 else ""
    return state or "GONE"


def cancel(cluster: str, engine_id: str) -> None:
    try:
        _run(["scancel", engine_id], client_env(_profile(_shape(cluster))))
    except (RuntimeError, subprocess.SubprocessError):
        pass  # Slurm unreachable: the agents' lease ends the allocation anyway
