"""A full disk under the data dir, for real: a small tmpfs (mounted here, as root) holds the
data dir of a real launcher; the test fills it while a real job runs."""

from __future__ import annotations

import errno
import os
import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LauncherEnv, wait_for

from jupyter_dlc.client import LauncherError

SLEEPER = """
import time
while True:
    time.sleep(0.1)
"""


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `path` (root only: skips the test otherwise)."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "32m") as mount:
        env = LauncherEnv(str(mount))
        yield env
        env.close()


def fill(path: str) -> None:
    """Write until the disk says no more."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as error:
                    assert error.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)


def test_submit_on_a_full_disk_gets_one_clear_line_and_leaves_nothing(small_disk):
    launcher = small_disk
    script = launcher.script("sleeper.py", SLEEPER)
    filler = os.path.join(launcher.root, "filler")
    fill(filler)
    with pytest.raises(LauncherError) as refused:
        launcher.client.submit({"script": script, "name": "full"})
    assert refused.value.status == 507
    message = str(refused.value)
    assert message.startswith(f"disk: no space left in {launcher.data_dir}") and "\n" not in message
    assert os.listdir(os.path.join(launcher.data_dir, "jobs")) == []  # no orphan job dir
    os.unlink(filler)

    def submitted():
        try:
            return launcher.client.submit({"script": script, "name": "after", "args": []})
        except LauncherError as error:
            assert error.status == 507, error
            return None
    job = wait_for(submitted, timeout=30, what="submits to work again once space is back")
    launcher.client.stop(job["id"], grace=0)


def test_dead_rank_is_detected_while_reports_cannot_be_stored(small_disk):
    from jupyter_dlc.widgets import JobView

    launcher = small_disk
    client = launcher.client
    job = client.submit({"script": launcher.script("sleeper.py", SLEEPER), "name": "victim",
                         "max_restarts": 0})
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", timeout=90, what="RUNNING")
    fill(os.path.join(launcher.root, "filler"))
    wait_for(lambda: client.job(job["id"])["storage"], timeout=10, what="the condition in the summary")
    [rank] = client.job(job["id"])["ranks"]
    os.kill(rank["pid"], signal.SIGKILL)
    def failed():
        current = client.job(job["id"])
        return current if current["state"] == "FAILED" else None
    ended = wait_for(failed, timeout=60, what="the dead rank to fail the job")
    assert "rank 0" in ended["reason"]
    assert ended["storage"].startswith(f"no space left in {launcher.data_dir}")
    view = JobView(client, job["id"])
    view.refresh_now()
    assert "no space left in" in view.header.value
    view.close()


def test_whichever_process_meets_the_full_disk_the_other_sees_it(tmp_path):
    """The launcher and its ingest worker each keep a DiskGuard over one reserve file. When
    the worker's write fails first, it gives the reserve up, and the 4 MB freed make the disk
    look fine to the launcher's free-space check. The launcher still counts it full (its
    summaries say so), until space is back and either process has taken the reserve again.
    On a real 12 MB tmpfs (root)."""
    from jupyter_dlc.launcher.storage import DiskGuard

    with tmpfs(tmp_path / "disk", "12m") as mount:
        launcher, worker = DiskGuard(str(mount)), DiskGuard(str(mount))
        fill(str(mount / "filler"))
        worker.on_full()  # its commit failed for want of space
        assert worker.free() > 2 * (1 << 20)  # the reserve's space is free again
        launcher.check()
        worker.check()
        assert launcher.full and worker.full and launcher.message.startswith("no space left in")
        os.unlink(mount / "filler")
        worker.check()  # the first to look takes the reserve again; the other follows
        launcher.check()
        assert not worker.full and not launcher.full and os.path.exists(worker.reserve)


# About 50 MB of output, as fast as a rank can print it, then one last line.
PRINTER = """
import sys
block = "".join(f"line {i} " + "x" * 80 + "\\n" for i in range(1000))
for n in range(560):
    sys.stdout.write(block.replace("line ", f"line {n}:", 1000))
print("LAST LINE", flush=True)
"""

# A rank that says something every 50 ms until it is stopped.
TALKER = """
import time
i = 0
while True:
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.05)
"""


def whole_log(client, job_id: str, rank: int = 0) -> list[str]:
    """Every line of a rank's log through the logs route, page by page with its cursor."""
    lines: list[str] = []
    cursor = None
    while True:
        page = client.logs(job_id, rank=rank, cursor=cursor)
        if not page["lines"]:
            return lines
        lines += [line["text"] for line in page["lines"]]
        cursor = page["cursor"]


def stop_status(client, job_id: str) -> int:
    """What a stop answers: its status, the refusals included."""
    try:
        return client.request("POST", f"/api/jobs/{job_id}/stop", body={"grace": 0})[0]
    except LauncherError as error:
        assert error.status != 500, f"stop answered 500: {error}"
        return error.status or 0


def test_a_rank_printing_50_mb_on_a_16_mib_data_dir_keeps_its_logs_head_and_tail(tmp_path):
    """Issue 26: the print filled the disk, the rank died of ENOSPC, and the restart sat in
    STARTING. Now the rank's log is capped (its head, a marker, a rolling tail), stops growing
    while the disk is low, and the job simply succeeds; the logs route and its cursor read
    the capped log from its first line to its last."""
    with tmpfs(tmp_path / "disk", "16m") as mount:
        launcher = LauncherEnv(str(mount))
        try:
            client = launcher.client
            job = client.submit({"script": launcher.script("printer.py", PRINTER), "name": "printer",
                                 "max_restarts": 1})
            done = client.wait(job["id"], timeout=180)
            assert done["state"] == "SUCCEEDED" and done["attempt"] == 1, done["reason"]
            assert done["storage"] is None  # the store never went without room
            log = os.path.join(done["job_dir"], "attempt-1", "rank-0.log")
            held = os.stat(log).st_blocks * 512
            assert held < 12 << 20 and os.path.getsize(log) > 50 * 10**6
            lines = whole_log(client, job["id"])
            assert lines[0].startswith("line 0:0 ") and lines[-1] == "LAST LINE"
            [marker] = [line for line in lines if line.startswith("[jupyter-dlc]")]
            assert "MiB of output dropped here" in marker and "DLC_RANK_LOG_MIB" in marker
            # Whole lines on either side of the cut: the tail's first line is not a fragment.
            assert all(line.startswith("line ") for line in lines if line not in (marker, "LAST LINE"))
            assert client.logs(job["id"], rank=0, tail=2)["lines"][-1]["text"] == "LAST LINE"
            assert launcher.own_processes() == []
        finally:
            launcher.close()


def test_a_store_that_cannot_write_ends_its_jobs_with_the_reason_and_stop_still_answers(tmp_path):
    """Issue 26: with the reserve spent, a restart sat in STARTING with nothing alive, the
    supervisor logged `database or disk is full` every tick and stop answered 500. Now no
    attempt starts on a full disk, a job the store can no longer follow ends FAILED with the
    condition (written with the last reserve), and stop answers."""
    with tmpfs(tmp_path / "disk", "16m") as mount:
        launcher = LauncherEnv(str(mount))
        try:
            client = launcher.client
            script = launcher.script("talker.py", TALKER)
            restarting = client.submit({"script": script, "name": "restarting", "max_restarts": 3})
            stopped = client.submit({"script": script, "name": "stopped"})
            for job in (restarting, stopped):
                wait_for(lambda job=job: client.job(job["id"])["state"] == "RUNNING", timeout=90,
                         what="RUNNING")
            filler = os.path.join(launcher.root, "filler")
            fill(filler)
            wait_for(lambda: client.job(stopped["id"])["storage"], timeout=10, what="the condition")
            fill(filler)  # what the reserve freed is taken too: the store cannot write at all
            assert stop_status(client, stopped["id"]) in (200, 202, 409)
            [rank] = client.job(restarting["id"])["ranks"]
            if rank["pid"]:
                try:
                    os.kill(rank["pid"], signal.SIGKILL)  # its attempt fails: no restart now
                except ProcessLookupError:
                    pass  # ended already: the store could not follow it
            ended = {job["id"]: client.wait(job["id"], timeout=60) for job in (restarting, stopped)}
            again = ended[restarting["id"]]
            assert again["state"] == "FAILED" and again["attempt"] == 1, again["reason"]
            assert again["reason"].startswith(f"disk full: no space left in {launcher.data_dir}; ")
            assert "\n" not in again["reason"]
            assert not [e for e in client.events(restarting["id"]) if e["attempt"] == 2]
            halted = ended[stopped["id"]]
            assert halted["state"] == "STOPPED" or halted["reason"].startswith("disk full: "), halted
            for job in (restarting, stopped):
                assert stop_status(client, job["id"]) == 409
            wait_for(lambda: launcher.own_processes() == [], timeout=30, what="nothing left running")
        finally:
            launcher.close()
