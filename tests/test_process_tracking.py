"""A daemon that escapes its job (double fork, new session, SIGTERM ignored, environment
cleared) must still end with the job: found through the attempt's cgroup, against a real
launcher and real torchrun. Skipped only where cgroup v2 is not writable here."""

from __future__ import annotations

import os

import pytest
from conftest import _alive as alive
from conftest import wait_for

from jupyter_dlc.hostprocs import cgroup_base

pytestmark = pytest.mark.skipif(
    cgroup_base() is None,
    reason="cgroup v2 is not mounted writable here: processes are tracked by environment only")

DAEMONIZER = """
import os, signal, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # survives exec
        # A fresh environment: nothing in it says which job this came from.
        os.execve("/bin/sh", ["sh", "-c", f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; "
                  "exec sleep 1000"], {"PATH": "/usr/bin:/bin"})
    os._exit(0)
os.wait()
while "--stay" in sys.argv:
    time.sleep(0.1)
"""


def daemon_pid(pidfile: str) -> int:
    def written():
        with open(pidfile) as f:
            return int(f.read())
    pid = wait_for(lambda: os.path.exists(pidfile) and written(), timeout=90, what="the daemon to start")
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert b"DLC_JOB_ID" not in f.read()  # invisible to the environment scan
    return pid


def test_escaped_daemon_does_not_survive_stop(launcher, tmp_path):
    script = launcher.script("daemonizer.py", DAEMONIZER)
    pidfile = str(tmp_path / "daemon.pid")
    job = launcher.client.submit({"script": script, "args": [pidfile, "--stay"], "name": "escape"})
    pid = daemon_pid(pidfile)
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", timeout=60, what="RUNNING")
    launcher.client.stop(job["id"], grace=1)
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "STOPPED", timeout=60, what="STOPPED")
    assert not alive(pid), "the daemon outlived the stopped job"


def test_escaped_daemon_does_not_survive_job_end(launcher, tmp_path):
    script = launcher.script("daemonizer.py", DAEMONIZER)
    pidfile = str(tmp_path / "daemon.pid")
    job = launcher.client.submit({"script": script, "args": [pidfile], "name": "escape"})
    pid = daemon_pid(pidfile)
    ended = launcher.client.wait(job["id"], timeout=120)
    assert ended["state"] == "SUCCEEDED", ended["reason"]
    wait_for(lambda: not alive(pid), timeout=10, what="the daemon to be killed with its job")
    base = cgroup_base()
    wait_for(lambda: not [n for n in os.listdir(base) if n.startswith(job["id"] + ".")],
             timeout=10, what="the ended job's cgroups to be removed")


def test_a_long_empty_cgroup_goes_at_the_next_scan_whoever_made_it():
    """A launcher killed with -9 leaves its jobs' empty cgroups; every later scan of every
    launcher read them all. An empty one older than STALE_CGROUP_S goes at the next scan;
    one that holds a process stays (the kernel refuses), as does a fresh empty one."""
    import subprocess
    import time

    from jupyter_dlc import hostprocs

    base = cgroup_base()
    tag = f"cgtest-{os.getpid()}"
    stale, live, fresh = (os.path.join(base, f"{kind}-{tag}.1") for kind in ("stale", "live", "fresh"))
    for path in (stale, live, fresh):
        os.mkdir(path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(live, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        made = time.time() - 2 * hostprocs.STALE_CGROUP_S
        for path in (stale, live):
            os.utime(path, (made, made))
        found = hostprocs.job_processes()
        assert not os.path.exists(stale)
        assert os.path.isdir(live) and found[(f"live-{tag}", 1)] == [sleeper.pid]
        assert os.path.isdir(fresh)
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (stale, live, fresh):
            wait_for(lambda p=path: _rmdir(p), timeout=10, what=f"{path} removed")


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
