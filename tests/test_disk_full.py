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
