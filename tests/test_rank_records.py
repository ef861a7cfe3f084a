"""A rank's records (start, end, first error) travel over the report route for every engine;
where the job directory is shared (the local engine) they are written there too, first.
Real torchrun ranks and a real launcher on loopback."""

from __future__ import annotations

import json
import os

from jupyter_dlc import layout

from conftest import wait_for


def test_local_ranks_report_their_end_and_first_error_and_keep_the_files(launcher):
    script = launcher.script("fails.py", """
        import json, os, time
        if os.environ["RANK"] == "0":
            os._exit(0)
        other = os.path.join(os.environ["DLC_ATTEMPT_DIR"], "rank-0.json")
        def left():  # rank 0 has left (and reported it)
            try:
                return "exit_code" in json.load(open(other))
            except (OSError, ValueError):
                return False
        while not left():
            time.sleep(0.05)
        raise KeyError("no such column")
        """)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                  "max_restarts": 0})
    final = launcher.client.wait(job["id"], timeout=90)
    assert final["state"] == "FAILED", final["reason"]
    events = [e for e in launcher.client.events(job["id"]) if e["type"] in layout.RECORD_EVENTS]
    ends = {e["data"]["rank"]: e["data"] for e in events if e["type"] == layout.RANK_END}
    assert ends[0]["exit_code"] == 0 and ends[1]["exit_code"] == 1  # os._exit is reported too
    [error] = [e["data"] for e in events if e["type"] == layout.RANK_ERROR]
    assert error["rank"] == 1 and error["error"] == "KeyError"
    # No rank_start over the route here: the file is the local fast path.
    assert not [e for e in events if e["type"] == layout.RANK_START]
    attempt_dir = layout.attempt_dir(final["job_dir"], 1)
    with open(layout.rank_error_json(attempt_dir, 1)) as f:
        on_disk = json.load(f)
    assert on_disk["t"] == error["t"] and on_disk["type"] == "KeyError"
    with open(layout.rank_json(attempt_dir, 0)) as f:
        assert json.load(f)["pid"] == ends[0]["pid"]
    assert os.path.exists(layout.rank_json(attempt_dir, 1))


def test_a_first_error_reaches_the_launcher_before_the_exit_handlers_end(launcher):
    """With the runtime's reporter running, a rank's first error goes out as it is raised,
    not after its exit handlers: the launcher's verdict on a killed peer waits for it."""
    script = launcher.script("slow_exit.py", """
        import atexit, os, time
        from jupyter_dlc import runtime
        runtime.init()
        runtime.log(1, loss=1.0)
        release = os.path.join(os.environ["DLC_ATTEMPT_DIR"], "release")
        def slow_handler():  # an exit handler that takes its time (a last upload, say)
            while not os.path.exists(release):
                time.sleep(0.02)
        atexit.register(slow_handler)
        raise KeyError("no such column")
        """)
    client = launcher.client
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 1, "max_restarts": 0})

    def error_seen():
        return [e for e in client.events(job["id"]) if e["type"] == layout.RANK_ERROR]
    [error] = wait_for(error_seen, 90, what="the rank's first error over the route")
    assert error["data"]["error"] == "KeyError"
    row = client.job(job["id"])
    # Still in its exit handler: no end record yet, and the job has not ended.
    assert row["state"] in ("STARTING", "RUNNING"), row
    assert not [e for e in client.events(job["id"]) if e["type"] == layout.RANK_END]
    attempt_dir = layout.attempt_dir(row["job_dir"], 1)
    open(os.path.join(attempt_dir, "release"), "w").close()
    final = client.wait(job["id"], timeout=60)
    assert final["state"] == "FAILED", final["reason"]
    assert len(error_seen()) == 1  # queued early, not sent again with the end record
