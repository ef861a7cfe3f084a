"""Races between the HTTP thread and the supervisor, against a real launcher: a stop that
comes right after a submit must win, leave nothing running, and let a delete through."""

from __future__ import annotations

import itertools
import os
import time

from conftest import wait_for

from jupyter_dlc.hostprocs import job_processes

# First thing the script does: leave a marker, so the test knows whether a rank ever ran.
MARKED_SLEEPER = """
import sys, time
open(sys.argv[1], "w").close()
while True:
    time.sleep(0.1)
"""

# Every path a stopped job's state events may take (each from QUEUED).
LEGAL_NEXT = {
    "QUEUED": {"PREFLIGHT", "STOPPED"},
    "PREFLIGHT": {"PREFLIGHT", "STARTING", "STOPPED", "FAILED"},
    "STARTING": {"RUNNING", "STOPPING"},
    "RUNNING": {"STOPPING"},
    "STOPPING": {"STOPPING", "STOPPED"},
}


def state_path(client, job_id: str) -> list[str]:
    return [e["state"] for e in client.events(job_id) if e["type"] == "state" and e["state"]]


def assert_legal(path: list[str]) -> None:
    assert path[0] == "QUEUED" and path[-1] == "STOPPED", path
    for before, after in itertools.pairwise(path):
        assert after in LEGAL_NEXT.get(before, set()), f"{before} -> {after} in {path}"


def ended_job(client, job_id: str) -> dict | None:
    job = client.job(job_id)
    return job if job["state"] in ("SUCCEEDED", "FAILED", "STOPPED") else None


def processes_of(job_id: str) -> list[int]:
    return [pid for (job, _), pids in job_processes().items() if job == job_id for pid in pids]


def test_stop_right_after_submit_always_wins(launcher, tmp_path):
    script = launcher.script("marked.py", MARKED_SLEEPER)
    client = launcher.client
    ran = 0
    for i in range(20):
        marker = str(tmp_path / f"ran-{i}")
        job = client.submit({"script": script, "args": [marker], "name": f"race{i}"})
        # The stop lands at a different moment of the supervisor's start each time (0 to
        # 95 ms after the submit answered): before it reads the queue, mid-preflight, mid-spawn.
        time.sleep(i * 0.005)
        client.stop(job["id"])
        ended = wait_for(lambda job_id=job["id"]: ended_job(client, job_id), timeout=60,
                         what=f"job {i} to end")
        assert ended["state"] == "STOPPED", (ended["state"], ended["reason"])
        # Recorded STOPPED means nothing of it runs any more: not a moment later, now.
        left = processes_of(job["id"])
        path = state_path(client, job["id"])
        assert left == [], (path, left)
        assert_legal(path)
        if os.path.exists(marker):
            ran += 1
            assert "STARTING" in path, path  # a rank can only have run once agents started
        client.delete(job["id"])  # 204, never 409
    print(f"{ran} of 20 scripts began before their stop (each killed, none left)")


def test_delete_right_after_stop_is_never_refused(launcher):
    script = launcher.script("marked.py", MARKED_SLEEPER)
    client = launcher.client
    for i in range(5):
        job = client.submit({"script": script, "args": [os.devnull], "name": f"del{i}"})
        client.stop(job["id"])
        client.delete(job["id"])  # raises LauncherError on 409
        assert processes_of(job["id"]) == []
    assert client.jobs() == []


def test_stop_while_restarting_ends_the_job_at_once(launcher):
    """RESTARTING (here: waiting out the backoff before a second restart) stops at once."""
    client = launcher.client
    # A different message each attempt: not "the same failure twice", which is not retried.
    script = launcher.script("crash.py", "import os\n"
                             "raise RuntimeError('crash in attempt ' + os.environ['DLC_ATTEMPT'])\n")
    job = client.submit({"script": script, "name": "crashy", "max_restarts": 5,
                         "restart_backoff": 600})
    wait_for(lambda: client.job(job["id"])["attempt"] == 2
             and client.job(job["id"])["state"] == "RESTARTING", timeout=120,
             what="the backoff before a second restart")
    client.stop(job["id"])
    ended = client.job(job["id"])
    assert ended["state"] == "STOPPED", (ended["state"], ended["reason"])
    assert processes_of(job["id"]) == []
    path = state_path(client, job["id"])
    assert path[-2:] == ["RESTARTING", "STOPPED"], path
    client.delete(job["id"])
