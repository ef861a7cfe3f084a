"""Engine-neutral facts on a real Slurm cluster (`scripts/local-slurm.sh`, its own ports so it
can run beside tests/test_slurm.py): the ranks' records (pid, exit, first error) reach the
launcher over the report route, not through the job directory.
"""

from __future__ import annotations

import glob
import os

import pytest
import test_slurm
from test_slurm import CLUSTER, local_slurm

from jupyter_dlc import layout

# test_slurm's launcher fixture, over this module's own `slurm` cluster.
launcher = test_slurm.launcher

RAISES = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    raise ValueError("shard 7 is corrupt")
while True:  # rank 0 waits until the launcher ends the attempt
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm-records"), "17017") as client_env:
        yield client_env


def test_first_error_comes_over_the_report_route_not_the_job_directory(launcher, slurm):
    script = launcher.script("raises.py", RAISES)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "cluster": CLUSTER, "max_restarts": 0})
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
