"""The launcher's event loop never waits on an engine (issue 21): a Slurm submit held in
`sbatch` (a real local Slurm cluster, `scripts/local-slurm.sh`, and an `sbatch` on PATH that
waits until the test lets it go, then runs the real one) holds up neither the reports of
64 simulated ranks nor the job list nor other jobs' actions; a stop of the held job is
answered at once and carried out once the submit returns. And the supervisor reaps only
the processes the launcher started, never another thread's `scancel` or `ssh`.

The order of events is what is asserted (everything answered while the submit was still
held); the latencies are printed, not asserted, on a shared machine. benchmarks/held_submit.py
measures them.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import shutil
import subprocess
import threading
import time

import pytest
from conftest import LauncherEnv, wait_for
from test_ingest import ended_world
from test_jobs import SLEEPER
from test_slurm import CLUSTER, engine_id, local_slurm, squeue_ids

from jupyter_dlc.engines import children
from jupyter_dlc.client import LauncherError
from jupyter_dlc.launcher.store import Store
from jupyter_dlc.launcher.supervisor import Supervisor

SLURM_PORT = "17517"  # the controller's; test_slurm.py's cluster uses 16917
RANKS, PER_NODE = 64, 8
BATCH_INTERVAL = 0.25  # a node reporter's pace
LOAD_SECONDS = 15.0  # of reports while the submit is held (sbatch's own timeout is 30 s)


class HeldSbatch:
    """An `sbatch` first on PATH: the first call waits for a line on a FIFO, then it and
    every later call run the real sbatch. The test holds the FIFO open for writing, so the
    wrapper's read blocks until `release` writes (never a fixed sleep)."""

    def __init__(self, root, real: str):
        self.dir = str(root)
        os.makedirs(self.dir, exist_ok=True)
        fifo = os.path.join(self.dir, "release")
        os.mkfifo(fifo)
        # Read-write: opening never blocks, and the wrapper's open for reading finds a writer.
        self._fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        with open(os.path.join(self.dir, "sbatch"), "w") as f:
            f.write(f"""#!/bin/sh
if mkdir "{self.dir}/taken" 2>/dev/null; then
    echo $$ > "{self.dir}/held"
    read line < "{fifo}"
    : > "{self.dir}/released"
fi
exec {real} "$@"
""")
        os.chmod(os.path.join(self.dir, "sbatch"), 0o755)

    def held(self) -> bool:
        """Whether the first sbatch is waiting now (not let go, nor killed by its timeout)."""
        try:
            with open(os.path.join(self.dir, "held")) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            return False
        return not self.released() and os.path.exists(f"/proc/{pid}") and not _zombie(pid)

    def released(self) -> bool:
        return os.path.exists(os.path.join(self.dir, "released"))

    def release(self) -> None:
        if self._fd is not None:
            os.write(self._fd, b"go\n")

    def close(self) -> None:
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm"), SLURM_PORT) as client_env:
        yield client_env


@pytest.fixture
def held(slurm, tmp_path, monkeypatch):
    real = shutil.which("sbatch", path=slurm["PATH"])
    assert real, "sbatch is not on PATH"
    hold = HeldSbatch(tmp_path / "hold", real)
    # The launcher started next inherits this PATH: its sbatch is the wrapper.
    monkeypatch.setenv("PATH", hold.dir + os.pathsep + os.environ["PATH"])
    yield hold
    hold.close()


@pytest.fixture
def launcher(held, tmp_path):
    env = LauncherEnv(str(tmp_path / "launcher"))
    yield env
    env.close()


def held_submit(launcher, held) -> dict:
    """A 1x1 Slurm job whose start waits in the held sbatch (the supervisor holds its lock)."""
    job = launcher.client.submit({"script": launcher.script("sleeper.py", SLEEPER), "nodes": 1,
                                  "nproc_per_node": 1, "cluster": CLUSTER, "name": "held"})
    wait_for(held.held, 120, what="the job's submit waiting in the held sbatch")
    return job


def post(client, path: str, body: dict | None = None) -> tuple[int, dict]:
    return client.request("POST", path, body=body or {})


def state_path(client, job_id: str) -> list[str]:
    return [e["state"] for e in client.events(job_id) if e["type"] == "state" and e["state"]]


class RankLoad:
    """64 simulated ranks on 8 nodes, each node posting its ranks' batch (as its node
    reporter would) every quarter second over one keep-alive connection; every answer's
    status and latency recorded."""

    def __init__(self, client, job_id: str):
        self.host, port = client.url.split("//")[1].split(":")
        self.port = int(port)
        self.path = f"/api/jobs/{job_id}/report"
        self.token = client.token
        self.done = threading.Event()
        self.results: list[tuple[int, float]] = []  # (status, ms)
        self.threads = [threading.Thread(target=self._node, args=(n,), daemon=True)
                        for n in range(RANKS // PER_NODE)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _node(self, node: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
        for step in itertools.count():
            if self.done.is_set():
                break
            body = json.dumps({"node": node, "ranks": [
                {"rank": rank, "metrics": [{"t": time.time(), "step": step, "values": {"loss": 1.0 / (step + 1)}}]}
                for rank in range(node * PER_NODE, (node + 1) * PER_NODE)]})
            start = time.perf_counter()
            try:
                conn.request("POST", self.path, body, headers)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except OSError:  # no answer within the timeout: counted, and a new connection
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                status = 0
            self.results.append((status, (time.perf_counter() - start) * 1000))
            self.done.wait(BATCH_INTERVAL)
        conn.close()


class Lister:
    """GET /api/jobs ten times a second, each latency recorded."""

    def __init__(self, client):
        self.client = client
        self.done = threading.Event()
        self.results: list[tuple[int, float]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            start = time.perf_counter()
            try:
                status = self.client.request("GET", "/api/jobs")[0]
            except LauncherError:  # unreachable: no answer within the client's timeout
                status = 0
            self.results.append((status, (time.perf_counter() - start) * 1000))
            self.done.wait(0.1)


def percentile(results: list[tuple[int, float]], q: float) -> float:
    ordered = sorted(ms for _, ms in results)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else float("nan")


def test_reports_reads_and_other_jobs_actions_are_answered_while_a_submit_is_held(launcher, held, slurm,
                                                                                 monkeypatch):
    # The simulated ranks report to an ended job of their world (a rank outside it is a 400).
    target = ended_world(launcher, monkeypatch, RANKS // PER_NODE, PER_NODE)
    client = launcher.client
    slow = held_submit(launcher, held)
    load, lister = RankLoad(client, target["id"]), Lister(client)
    load.start()
    lister.thread.start()
    try:
        # While the supervisor waits in sbatch (holding the held job's lock): a stop of the
        # held job, a Slurm submit (its sinfo), a local job's stop and delete (its process
        # scan), each answered, none waiting for the sbatch.
        status, job = post(client, f"/api/jobs/{slow['id']}/stop")
        assert status == 202 and job["state"] == "PREFLIGHT", (status, job["state"])
        other = client.submit({"script": launcher.script("sleeper.py", SLEEPER), "nodes": 1,
                               "nproc_per_node": 1, "cluster": CLUSTER, "name": "other"})
        local = client.submit({"script": launcher.script("sleeper.py", SLEEPER), "name": "local"})
        stopped = client.stop(local["id"])  # never started: its stop takes its own lock only
        assert stopped["state"] == "STOPPED", stopped["state"]
        client.delete(local["id"])
        wait_for(lambda: len(load.results) >= (RANKS // PER_NODE) * LOAD_SECONDS / BATCH_INTERVAL * 0.5
                 and len(lister.results) >= 20, LOAD_SECONDS * 4, what="reports and reads under load")
        # All of that, and every report and read counted, came while the submit was held.
        assert held.held(), "the sbatch was let go before the load was answered"
    finally:
        held.release()
        load.stop()
        lister.done.set()
        lister.thread.join(timeout=60)
    assert {status for status, _ in load.results} == {200}
    assert {status for status, _ in lister.results} == {200}
    print(f"while the submit was held: {len(load.results)} node batches of {PER_NODE} ranks, "
          f"p99 {percentile(load.results, 99):.1f} ms (goal 50); {len(lister.results)} job lists, "
          f"p99 {percentile(lister.results, 99):.1f} ms (goal 100)")
    final = client.wait(slow["id"], timeout=120)
    assert final["state"] == "STOPPED", (final["state"], final["reason"])
    client.stop(other["id"])
    assert client.wait(other["id"], timeout=120)["state"] == "STOPPED"
    ids = [engine_id(client, slow["id"]), engine_id(client, other["id"])]
    wait_for(lambda: not set(ids) & set(squeue_ids(slurm)), 60, what="both Slurm jobs gone")


def test_a_stop_during_a_held_submit_is_answered_at_once_and_cancels_once_it_returns(launcher, held, slurm):
    client = launcher.client
    slow = held_submit(launcher, held)
    status, job = post(client, f"/api/jobs/{slow['id']}/stop", {"grace": 30})
    assert status == 202, status
    assert job["state"] == "PREFLIGHT" and job["attempts"][-1]["engine_id"] is None
    assert held.held()  # answered while the sbatch still waits
    # A second stop joins the one in flight.
    assert post(client, f"/api/jobs/{slow['id']}/stop")[0] == 202
    held.release()
    final = client.wait(slow["id"], timeout=120)
    assert final["state"] == "STOPPED", (final["state"], final["reason"])
    path = state_path(client, slow["id"])
    # Submitted, then killed at once (a job whose script has not begun gets no grace).
    assert path[:3] == ["QUEUED", "PREFLIGHT", "STARTING"] and path[-2:] == ["STOPPING", "STOPPED"], path
    slurm_id = engine_id(client, slow["id"])
    assert slurm_id and slurm_id.isdigit()
    wait_for(lambda: slurm_id not in squeue_ids(slurm), 60, what="the submitted Slurm job cancelled")
    client.delete(slow["id"])


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_the_supervisor_reaps_only_the_processes_the_launcher_started(tmp_path):
    """A child another thread started (a stop's scancel, an ssh) keeps its exit code for that
    thread however the supervisor ticks; one an engine handed over (a node agent) is reaped."""
    store = Store(str(tmp_path / "launcher.sqlite"))
    supervisor = Supervisor(store, str(tmp_path), "http://127.0.0.1:9", tick=0.01)
    theirs = subprocess.Popen(["sh", "-c", "exit 3"])  # as subprocess.run(["scancel", ...]) starts it
    ours = children.detach(subprocess.Popen(["sh", "-c", "exit 0"]))  # as local._spawn does
    wait_for(lambda: _zombie(theirs.pid) and _zombie(ours), 30, what="both children exited")
    supervisor.start()
    try:
        wait_for(lambda: not os.path.exists(f"/proc/{ours}"), 30, what="the handed-over child reaped")
        assert _zombie(theirs.pid)  # ticks went by after both ended: still the starter's
        assert theirs.wait(timeout=10) == 3
    finally:
        supervisor.stopped.set()
        supervisor.wake.set()
        supervisor.join(timeout=30)
