"""Engine-neutral facts on a real Slurm cluster (`scripts/local-slurm.sh`, its own ports so it
can run beside tests/test_slurm.py): the ranks' records (pid, exit, first error) reach the
launcher over the report route, not through the job directory.
"""

from __future__ import annotations

import glob
import os

import pytest
import test_slurm
from conftest import wait_for
from test_slurm import CLUSTER, local_slurm

from jupyter_dlc import layout

# test_slurm's launcher fixture, over this module's own `slurm` cluster.
launcher = test_slurm.launcher

RAISES = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
while rank == 1:  # raises once the test opens the gate (both ranks are RUNNING by then)
    if os.path.exists(sys.argv[1]):
        raise ValueError("shard 7 is corrupt")
    time.sleep(0.1)
while True:  # rank 0 waits until the launcher ends the attempt
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def unshared(tmp_path_factory):
    """A directory node n2 does not share with the other nodes (nor with the launcher)."""
    return tmp_path_factory.mktemp("unshared")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, unshared):
    with local_slurm(tmp_path_factory.mktemp("slurm-records"), "17017",
                     private_dir=f"n2:{unshared}") as client_env:
        yield client_env


def test_first_error_comes_over_the_report_route_not_the_job_directory(launcher, slurm):
    script = launcher.script("raises.py", RAISES)
    gate = os.path.join(launcher.root, "gate")
    job = launcher.client.submit({"script": script, "args": [gate], "nodes": 2,
                                  "nproc_per_node": 1, "cluster": CLUSTER, "max_restarts": 0})
    # RUNNING needs every rank's pid, which only their reported rank_start carries here.
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", 120, what="RUNNING")
    open(gate, "w").close()
    final = launcher.client.wait(job["id"], timeout=180)
    assert final["state"] == "FAILED", final["reason"]
    assert final["reason"].startswith("rank 1 exited with code 1"), final["reason"]
    [diagnosis] = launcher.client.diagnosis(job["id"])
    assert diagnosis["rank"] == 1 and diagnosis["exit_code"] == 1
    assert "ValueError: shard 7 is corrupt" in diagnosis["line"]
    # The proof that the route delivered it: the ranks wrote no record files at all (the
    # Slurm engine runs them with DLC_RANK_RECORDS=report), yet the launcher knows each
    # rank's pid and exit, and rank 1's traceback.
    attempt_dir = layout.attempt_dir(final["job_dir"], 1)
    assert glob.glob(os.path.join(attempt_dir, "rank-*.json")) == []
    assert os.path.exists(layout.rank_log(attempt_dir, 1))  # logs still go to the directory
    events = launcher.client.events(job["id"])
    reported = [e for e in events if e["type"] in layout.RECORD_EVENTS]
    [error] = [e["data"] for e in reported if e["type"] == layout.RANK_ERROR]
    assert error["rank"] == 1 and error["error"] == "ValueError"
    assert 'raise ValueError("shard 7 is corrupt")' in error["traceback"]
    assert diagnosis["time"] == error["t"]  # the diagnosis read the reported record
    ends = {e["data"]["rank"]: e["data"] for e in reported if e["type"] == layout.RANK_END}
    assert ends[1]["exit_code"] == 1 and ends[1]["pid"] > 0
    starts = {e["data"]["rank"] for e in reported if e["type"] == layout.RANK_START}
    assert starts == {0, 1}
    ranks = {r["rank"]: r for r in final["ranks"]}
    assert ranks[1]["exit_code"] == 1 and ranks[1]["pid"] == ends[1]["pid"]
    # Records are not heartbeats: a plain script (no runtime) is judged by its exit only.
    assert ranks[0]["last_heartbeat"] is None
    # Preflight ran on both nodes before the agents, and both saw node 0's nonce.
    checks = [e["data"] for e in events if e["type"] == layout.NODE_PREFLIGHT]
    assert sorted((c["node"], c["ok"]) for c in checks) == [(0, True), (1, True)]


def test_a_node_that_does_not_see_the_checkpoint_directory_fails_preflight_by_name(
        launcher, slurm, unshared):
    """Node n2 runs in a mount namespace with an empty tmpfs over `unshared`: it passes a
    writability check there, but does not see what node 0 wrote. Preflight runs on the
    allocated nodes before any agent, names the node and the fix, and nothing is retried."""
    script = launcher.script("never.py", "raise SystemExit('must not run')\n")
    job = launcher.client.submit({"script": script, "nodes": 4, "nproc_per_node": 1,
                                  "cluster": CLUSTER, "max_restarts": 2,
                                  "checkpoint_dir": str(unshared / "ckpt")})
    final = launcher.client.wait(job["id"], timeout=180)
    assert final["state"] == "FAILED" and final["attempt"] == 1
    assert final["reason"].startswith("preflight on node 1 (n2): n2 does not see the checkpoint "
                                      f"directory {unshared / 'ckpt'}"), final["reason"]
    assert "mount the same shared filesystem at that path on every node" in final["reason"]
    attempt_dir = layout.attempt_dir(final["job_dir"], 1)
    assert not glob.glob(os.path.join(attempt_dir, "node-*.log"))  # no agent started
    # Node 0 was cancelled mid-check; the engine's cleanup of the ended job removes its marker.
    wait_for(lambda: not glob.glob(os.path.join(str(unshared / "ckpt"), ".dlc-preflight-*")), 30,
             what="no preflight marker left")
