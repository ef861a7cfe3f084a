"""Admission control against a real launcher and real jobs: ranks beyond the process slots
wait QUEUED with a reason, and start in submission order as slots free up."""

from __future__ import annotations

import pytest
from conftest import LauncherEnv, wait_for

from jupyter_dlc.client import LauncherError

# Holds its slot until the test drops a release file for it.
HOLDER = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@pytest.fixture
def two_slot_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("DLC_PROCESS_SLOTS", "2")
    env = LauncherEnv(str(tmp_path))
    yield env
    env.close()


def test_jobs_beyond_the_slots_wait_and_start_in_order(two_slot_launcher, tmp_path):
    launcher = two_slot_launcher
    client = launcher.client
    script = launcher.script("holder.py", HOLDER)
    with pytest.raises(LauncherError, match="3 processes exceed .* \\(2: DLC_PROCESS_SLOTS\\)"):
        client.submit({"script": script, "nodes": 1, "nproc_per_node": 3})
    release = [tmp_path / f"release-{i}" for i in range(4)]
    jobs = [client.submit({"script": script, "args": [str(release[i])], "name": f"hold{i}"})["id"]
            for i in range(4)]

    def states():
        return [client.job(j)["state"] for j in jobs]

    wait_for(lambda: states()[:2] == ["RUNNING", "RUNNING"], timeout=90, what="two jobs RUNNING")
    for j in jobs[2:]:
        job = client.job(j)
        assert job["state"] == "QUEUED"
        assert job["reason"] == "waiting for 1 process slot (2 of 2 in use)"
    release[1].touch()
    wait_for(lambda: states()[2] == "RUNNING", timeout=90, what="the third job to start")
    assert states()[3] == "QUEUED"  # the fourth waits its turn
    release[0].touch()
    wait_for(lambda: states()[3] == "RUNNING", timeout=90, what="the fourth job to start")
    for path in release[2:]:
        path.touch()
    ended = [client.wait(j, timeout=120) for j in jobs]
    assert [j["state"] for j in ended] == ["SUCCEEDED"] * 4
    starts = [j["started"] for j in ended]
    assert starts[2] < starts[3], "the fourth job started before the third"
