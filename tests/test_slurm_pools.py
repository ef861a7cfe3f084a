"""Warm pools on a real Slurm cluster (`scripts/local-slurm.sh`, its own ports so that it can
run beside tests/test_slurm.py), watched and stopped as if the nodes were other hosts.

The launcher here runs with the local engine's process scan (`job_processes`, /proc) made
blind: a `sitecustomize` on its PYTHONPATH replaces it with one that finds nothing. That is
a patch in the launcher process only, and the one way to prove from a single machine (whose
/proc *would* show the local cluster's ranks) that a pooled Slurm job is described, stopped
and killed through its node processes' files, the ranks' reports and squeue alone. The pool
agents and ranks never run it (the pool drops DLC_* variables; ranks are forks of an agent).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest
from conftest import LauncherEnv, wait_for
from test_jobs import SLEEPER
from test_slurm import CLUSTER, local_slurm, squeue_ids

from jupyter_dlc import layout
from jupyter_dlc.hostprocs import job_processes

BLIND = """
import os
if os.environ.get("DLC_TEST_BLIND_SCAN"):
    from jupyter_dlc import hostprocs

    hostprocs.job_processes = lambda *args, **kwargs: {}
    open(os.path.join(os.environ["DLC_TEST_BLIND_SCAN"], str(os.getpid())), "w").close()
"""

# Rank 0 leaves cleanly on SIGTERM (and says so); the others ignore it and must be killed.
GRACEFUL = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
def leave(*_):
    open(os.path.join(sys.argv[1], f"left-{rank}"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, leave if rank == 0 else signal.SIG_IGN)
print("up", os.getpid(), flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm-pools"), "17217") as client_env:
        yield client_env


@pytest.fixture(scope="module")
def pooled(slurm, tmp_path_factory):
    """A launcher whose /proc scan sees nothing, with a ready 2x2 pool on the cluster."""
    root = tmp_path_factory.mktemp("pooled")
    shim, marks = root / "shim", root / "marks"
    shim.mkdir()
    marks.mkdir()
    (shim / "sitecustomize.py").write_text(BLIND)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "DLC_TEST_BLIND_SCAN")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), saved["PYTHONPATH"]) if p)
    os.environ["DLC_TEST_BLIND_SCAN"] = str(marks)
    try:
        env = LauncherEnv(str(root))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    env.marks = str(marks)
    try:
        assert os.path.exists(os.path.join(str(marks), str(env.pid())))  # the launcher is blind
        env.client.pool_up(2, 2, cluster=CLUSTER)
        wait_for(lambda: [p for p in env.client.pools() if p["state"] == "ready"], 180,
                 what="pool ready")
        yield env
    finally:
        pools = env.client.pools()
        env.client.pool_down(cluster=CLUSTER)
        for allocation in [p["engine_id"] for p in pools]:
            wait_for(lambda a=allocation: a not in squeue_ids(slurm), 60, what="allocation released")
        env.close()


def _left(launcher: LauncherEnv, job_id: str) -> list[int]:
    """The job's processes, as this test process (not the launcher) sees them in /proc."""
    return [pid for (job, _), pids in job_processes().items() if job == job_id for pid in pids]


def _running(client, job_id: str) -> bool:
    job = client.job(job_id)
    return job["state"] == "RUNNING" and all(r["pid"] for r in job["ranks"])


def _sleeper_on_the_pool(pooled: LauncherEnv) -> dict:
    """A 2x2 job that sleeps until it is ended, running (every rank up) on the warm pool."""
    client = pooled.client
    job = client.submit({"script": pooled.script("sleeper.py", SLEEPER), "nodes": 2,
                         "nproc_per_node": 2, "cluster": CLUSTER, "max_restarts": 0})
    wait_for(lambda: _running(client, job["id"]), 120, what="ranks up")
    assert ran_warm(client, job["id"])
    return job


def _stop(pooled: LauncherEnv, job: dict) -> None:
    pooled.client.stop(job["id"], grace=2)
    assert pooled.client.wait(job["id"], timeout=90)["state"] == "STOPPED"


def ran_warm(client, job_id: str) -> bool:
    return any((e["reason"] or "").endswith(f"; warm pool {CLUSTER}-2x2")
               for e in client.events(job_id) if e["type"] == "state")


def test_kill_9_of_a_pooled_rank_ends_the_job_with_its_code(pooled):
    client = pooled.client
    agents = client.pools()[0]["agents"]
    job = _sleeper_on_the_pool(pooled)
    victim = next(r["pid"] for r in client.job(job["id"])["ranks"] if r["rank"] == 3)
    os.kill(victim, signal.SIGKILL)
    final = client.wait(job["id"], timeout=90)
    assert final["state"] == "FAILED" and final["reason"].startswith("rank 3"), final["reason"]
    assert "exited with code 137" in final["reason"], final["reason"]
    wait_for(lambda: not _left(pooled, job["id"]), 30, what="nothing of the job left")
    wait_for(lambda: client.pools()[0]["state"] == "ready", 30, what="pool free again")
    assert client.pools()[0]["agents"] == agents  # the same agents serve the next job


def _pool_record(pooled: LauncherEnv) -> dict:
    return layout.read_json(os.path.join(pooled.data_dir, "pools", f"{CLUSTER}-2x2", "pool.json")) or {}


def test_scancel_of_the_pool_fails_its_job_naming_the_node_and_replaces_the_pool(pooled, slurm):
    """...and the replacement starts in a directory of its own: the old allocation's agents
    end in Slurm's own time after the scancel, and a file they write or remove late must not
    be one of the new agents'."""
    client = pooled.client
    allocation = client.pools()[0]["engine_id"]
    before = _pool_record(pooled)["generation"]
    job = _sleeper_on_the_pool(pooled)
    subprocess.run(["scancel", allocation], env=slurm, check=True)
    final = client.wait(job["id"], timeout=120)
    assert final["state"] == "FAILED", final["reason"]
    # Every node went with the allocation; the reason names the first one seen lost.
    lost = re.match(rf"pool {CLUSTER}-2x2 lost node (\d) \(n(\d)\): its allocation {allocation} is [A-Z]+$",
                    final["reason"])
    assert lost and int(lost[2]) == int(lost[1]) + 1, final["reason"]  # node K runs on n(K+1)
    wait_for(lambda: not _left(pooled, job["id"]), 60, what="nothing of the job left")
    # Slurm said the allocation is gone: the launcher holds a new one for the shape.
    wait_for(lambda: [p for p in client.pools() if p["engine_id"] not in (None, allocation)],
             60, what="pool replaced")
    assert allocation not in squeue_ids(slurm)
    record = _pool_record(pooled)
    assert record["generation"] > before
    pool_dir = os.path.join(pooled.data_dir, "pools", f"{CLUSTER}-2x2")
    old_dir, new_dir = (os.path.join(pool_dir, f"gen-{g}") for g in (before, record["generation"]))
    # What the old agents would do late, as they go: their pid records and store marker.
    os.makedirs(old_dir, exist_ok=True)
    for name in ("node-0.pid", "node-1.pid", "store-ready.json"):
        with open(os.path.join(old_dir, name), "w") as f:
            f.write('{"pid": 1}')
        os.remove(os.path.join(old_dir, name))
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 180, what="new pool ready")
    assert os.path.exists(os.path.join(new_dir, "node-0.pid"))
    _stop(pooled, _sleeper_on_the_pool(pooled))  # the next job runs warm on the new agents


def test_a_lost_node_process_fails_its_job_naming_the_node(pooled):
    """kill -9 of node 1's node process (what owns its ranks and carries out the launcher's
    orders): its ranks die with it, and with no exit record and no sign of life for 30 s
    the job fails naming the node; node 0's ranks are ended by their own node process."""
    client = pooled.client
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 180, what="pool ready")
    job = _sleeper_on_the_pool(pooled)
    alive = os.path.join(layout.attempt_dir(client.job(job["id"])["job_dir"], 1), "node-1.alive")
    wait_for(lambda: os.path.exists(alive), 30, what="node 1's sign of life")
    with open(alive) as f:
        os.kill(json.load(f)["pid"], signal.SIGKILL)
    final = client.wait(job["id"], timeout=120)
    assert final["state"] == "FAILED", final["reason"]
    assert final["reason"].startswith(f"pool {CLUSTER}-2x2 lost node 1 (n2): no sign of its "
                                      "node process for"), final["reason"]
    wait_for(lambda: not _left(pooled, job["id"]), 30, what="nothing of the job left")
    # The lost node process holds the pool no longer: the same agents take the next job.
    wait_for(lambda: client.pools()[0]["state"] == "ready", 60, what="pool free again")
    after = _sleeper_on_the_pool(pooled)
    _stop(pooled, after)


def test_a_killed_agent_ends_the_allocation_and_the_pool_is_replaced(pooled, slurm):
    """An agent that dies (kill -9, OOM) fails its srun task, which ends the step
    (--kill-on-bad-exit) and the allocation with it: Slurm's word is how the launcher knows."""
    client = pooled.client
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 180, what="pool ready")
    pool = client.pools()[0]
    os.kill(pool["agents"][1], signal.SIGKILL)
    wait_for(lambda: pool["engine_id"] not in squeue_ids(slurm), 60, what="allocation ended")
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready" and
                      p["engine_id"] != pool["engine_id"]], 180, what="pool replaced")
    job = _sleeper_on_the_pool(pooled)
    _stop(pooled, job)
    wait_for(lambda: not _left(pooled, job["id"]), 30, what="nothing of the job left")
