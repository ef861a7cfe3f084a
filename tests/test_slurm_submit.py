"""Submits to a real Slurm cluster have an outcome and happen once (issues 21 and 26).

`scripts/local-slurm.sh` starts slurmctld and 4 slurmd on this machine (controller port 17317,
its own, so that this module runs beside the other Slurm modules). An `sbatch` of our own goes
first on PATH; it runs the real one, and files in its directory make it misbehave as a
cluster does:

- `hold`: the first submit goes through for real, then sbatch blocks (on a FIFO, until the
  test writes to it) before it answers: the window in which a launcher killed with -9 has
  submitted the attempt but not stored its Slurm id;
- `fail`: a count of submits to refuse first, with slurmctld's timeout message.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import LauncherEnv, wait_for
from test_slurm import local_slurm

PROFILE = "local-slurm"
TIMEOUT_MESSAGE = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"

STEPS = """
import time
from jupyter_dlc import runtime
runtime.init()
for step in range(1, 201):
    time.sleep(0.1)
    runtime.log(step, loss=1.0 / step)
"""

WRAPPER = """#!/bin/sh
# A stand-in for sbatch (tests/test_slurm_submit.py): the real one, misbehaving on request.
here={here}
if [ -f "$here/fail" ]; then
    left=$(cat "$here/fail")
    if [ "$left" -gt 0 ]; then
        echo $((left - 1)) > "$here/fail"
        echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
        exit 1
    fi
fi
out=$({real} "$@")
rc=$?
if [ "$rc" = 0 ] && [ -f "$here/hold" ] && mkdir "$here/held" 2>/dev/null; then
    echo "$out" > "$here/submitted.tmp" && mv "$here/submitted.tmp" "$here/submitted"
    read -r _ < "$here/release"
fi
echo "$out"
exit "$rc"
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    real = shutil.which("sbatch")
    with local_slurm(tmp_path_factory.mktemp("slurm"), "17317") as client_env:
        yield dict(client_env, REAL_SBATCH=real or "sbatch")


@pytest.fixture
def wrapper(slurm, tmp_path, monkeypatch):
    """The misbehaving sbatch, first on the PATH every launcher of the test starts with."""
    here = tmp_path / "sbatch-wrapper"
    here.mkdir()
    os.mkfifo(here / "release")
    (here / "sbatch").write_text(WRAPPER.format(here=here, real=slurm["REAL_SBATCH"]))
    (here / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}{os.environ['PATH']}")
    yield here
    try:  # a wrapper still holding its answer lets go (its launcher is gone)
        fd = os.open(here / "release", os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
    except OSError:
        pass  # nobody reads: nothing holds


@pytest.fixture
def launcher(wrapper, tmp_path, monkeypatch):
    monkeypatch.setenv("DLC_SUBMIT_BACKOFF", "0.5")
    env = LauncherEnv(str(tmp_path))
    yield env
    env.close()


def named(slurm, name: str) -> list[str]:
    """Every Slurm job of that name the controller knows, running or ended."""
    out = subprocess.run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"], env=slurm,
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_a_launcher_killed_between_sbatch_and_storing_the_id_adopts_the_job_and_runs_it_once(
        launcher, wrapper, slurm):
    (wrapper / "hold").write_text("")
    script = launcher.script("steps.py", STEPS)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "cluster": PROFILE, "heartbeat_interval": 1.0})
    name = f"dlc-{job['id']}-a1"
    wait_for(lambda: (wrapper / "submitted").exists(), 120, what="sbatch submitted, not yet answered")
    submitted = (wrapper / "submitted").read_text().strip().split(";")[0]
    assert launcher.client.job(job["id"])["state"] == "PREFLIGHT"
    launcher.restart(kill=True)  # kill -9 in the window, and a new launcher on the same data

    wait_for(lambda: launcher.client.job(job["id"])["state"] in ("RUNNING", "SUCCEEDED", "FAILED"),
             120, what="the attempt running")
    running = launcher.client.job(job["id"])
    assert running["attempts"][0]["engine_id"] == submitted, running["reason"]
    assert any(e["type"] == "adopted" for e in launcher.client.events(job["id"]))

    # A second Slurm job of the attempt's name (what the old launcher submitted twice), and
    # the node exits its batch script would write into the same attempt directory: they are
    # not the attempt's to honour, and the launcher cancels that job once it sees it.
    attempt_dir = os.path.join(running["job_dir"], "attempt-1")
    orphan = subprocess.run([slurm["REAL_SBATCH"], "--parsable", f"--job-name={name}", "--nodes=1",
                             f"--output={attempt_dir}/orphan-%j.out", "--wrap", "sleep 60"],
                            env=slurm, capture_output=True, text=True, check=True).stdout.strip()
    for node in (0, 1):
        with open(f"{attempt_dir}/node-{node}.exit.tmp", "w") as f:
            f.write(f"0 {orphan}\n")
        os.replace(f"{attempt_dir}/node-{node}.exit.tmp", f"{attempt_dir}/node-{node}.exit")
    wait_for(lambda: subprocess.run(["squeue", "-h", "-j", orphan, "-o", "%T"], env=slurm,
                                    capture_output=True, text=True).stdout.strip() in ("", "CANCELLED"),
             60, what="the duplicate cancelled")
    assert launcher.client.job(job["id"])["state"] == "RUNNING"

    final = launcher.client.wait(job["id"], timeout=180)
    assert final["state"] == "SUCCEEDED", final["reason"]
    assert final["last_step"] == 200  # every step ran: no verdict came from the orphan's exits
    assert final["attempt"] == 1
    # Exactly one Slurm job ran the attempt from the launcher: the one sbatch submitted first.
    assert sorted(named(slurm, name)) == sorted([submitted, orphan])
    for node in (0, 1):  # the exits that ended it are the adopted job's own records
        with open(f"{attempt_dir}/node-{node}.exit") as f:
            assert f.read().split() == ["0", submitted]


def test_a_transient_refusal_is_retried_in_view_and_the_job_runs(launcher, wrapper, slurm):
    (wrapper / "fail").write_text("2")
    script = launcher.script("steps.py", STEPS)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 1, "cluster": PROFILE})
    final = launcher.client.wait(job["id"], timeout=180)
    assert final["state"] == "SUCCEEDED", final["reason"]
    reasons = [e["reason"] for e in launcher.client.events(job["id"])]
    assert f"sbatch refused: retry 1 of 5 in 0.5 s: {TIMEOUT_MESSAGE}" in reasons, reasons
    assert f"sbatch refused: retry 2 of 5 in 1 s: {TIMEOUT_MESSAGE}" in reasons, reasons
    assert len(named(slurm, f"dlc-{job['id']}-a1")) == 1
