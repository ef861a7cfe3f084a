"""Shared fixtures: a real launcher process on loopback, in a private data and runtime dir."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from jupyter_dlc.hostprocs import job_processes
from jupyter_dlc.client import LauncherClient
from labserver import wait_until


# The fast tier (`bash scripts/test.sh --fast`, under 3 minutes with lint, types and jest):
# modules that need no cluster, browser, notebook kernel or many ranks, and run in seconds.
# A module joins when it stays that way; what it covers is still real (SQLite, loopback
# HTTP, torch in a process of its own), only small.
FAST_MODULES = frozenset({
    "test_agreement", "test_alerts", "test_atomic_files", "test_band_vectors", "test_bench_results",
    "test_bootstrap", "test_clusters", "test_dry_run", "test_engine_features", "test_event_loop", "test_evidence",
    "test_job_html", "test_kubernetes_export", "test_kubernetes_manifests",
    "test_magic_arguments", "test_metric_chunks", "test_node_copy", "test_pacing",
    "test_rank_records", "test_runtime_checkpoint", "test_runtime_layout", "test_shims",
    "test_supervisor_engine", "test_view_escaping",
})


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives a real JupyterLab in Chromium")
    config.addinivalue_line("markers", "slow: takes more than half a minute")
    config.addinivalue_line("markers", "fast: in the fast tier (FAST_MODULES)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in FAST_MODULES:
            item.add_marker(pytest.mark.fast)


class LauncherEnv:
    """A private launcher: its data dir, runtime dir and client."""

    def __init__(self, root: str):
        self.root = root
        self.data_dir = os.path.join(root, "data")
        self.runtime_dir = os.path.join(root, "runtime")
        self.env = {"DLC_DATA_DIR": self.data_dir, "JUPYTER_RUNTIME_DIR": self.runtime_dir}
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        self.client = LauncherClient.connect()

    def pid(self) -> int:
        return self.client.request("GET", "/healthz")[1]["pid"]

    def restart(self, kill: bool = True) -> None:
        """kill -9 the launcher (or SIGTERM it) and start a new one on the same data."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.time() + 10
        while time.time() < deadline and _alive(pid):
            time.sleep(0.05)
        self.client = LauncherClient.connect()

    def script(self, name: str, body: str) -> str:
        path = os.path.join(self.root, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(body))
        return path

    def own_processes(self) -> list[int]:
        return [pid for (job, _), pids in job_processes().items()
                if os.path.isdir(os.path.join(self.data_dir, "jobs", job)) for pid in pids]

    def close(self) -> None:
        try:
            os.kill(self.pid(), signal.SIGTERM)
        except Exception:
            pass
        for pid in self.own_processes():  # a failing test must not leak ranks into the next
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def launcher(tmp_path):
    env = LauncherEnv(str(tmp_path))
    yield env
    env.close()


@pytest.fixture(scope="module")
def shared_launcher(tmp_path_factory):
    env = LauncherEnv(str(tmp_path_factory.mktemp("launcher")))
    yield env
    env.close()


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    return wait_until(predicate, timeout, what, interval)


PYTHON = sys.executable


def env_contract_spec(script: str, cwd, **more) -> dict:
    """The env-contract job every engine runs (what `assert_launcher_env` checks)."""
    return dict({"script": script, "args": ["--lr", "0.1"], "nodes": 2, "nproc_per_node": 2,
                 "name": "envjob", "network": "tcp", "workdir": str(cwd),
                 "env": {"USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0"}}, **more)


def assert_launcher_env(env: dict, job: dict, launcher: LauncherEnv, cwd, job_dir: str | None = None,
                        checkpoint_dir: str | None = None) -> None:
    """What every engine adds to torchrun's variables, as tests/test_jobs.py's env-contract
    job sees it (2 nodes x 2, `--network tcp`, `--env USER_VAR=x NCCL_SOCKET_IFNAME=lo0`,
    arguments `--lr 0.1`, run in `cwd`, None where the engine declares it does not honour
    --workdir). `job_dir`, `checkpoint_dir`: where the ranks see
    them, when not the launcher's job directory (an engine without a shared filesystem)."""
    assert env["DLC_JOB_ID"] == job["id"] and env["DLC_JOB_NAME"] == "envjob"
    assert env["DLC_ATTEMPT"] == "1" and env["DLC_NNODES"] == "2"
    assert env["DLC_LAUNCHER_URL"] == launcher.client.url
    assert env["DLC_TOKEN"] and env["DLC_TOKEN"] != launcher.client.token
    assert env["DLC_JOB_DIR"] == (job_dir or job["job_dir"])
    assert env["DLC_CHECKPOINT_DIR"] == (checkpoint_dir or os.path.join(job["job_dir"], "checkpoints"))
    assert env["DLC_RESUME_PATH"] == env["EASYCKPT_RESUME_PATH"] == ""
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "lo0"
    assert env["TORCH_FR_BUFFER_SIZE"] and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["USER_VAR"] == "x" and env["sum"] == 6.0
    assert env["argv"] == ["--lr", "0.1"]
    assert (env["cwd"] == str(cwd)) if cwd is not None else env["cwd"]


def assert_torchrun_env(env: dict, rank: int, nproc_per_node: int = 2, world: int = 4) -> None:
    """torchrun's part of the env contract for one rank, as the env-contract job sees it."""
    node = rank // nproc_per_node
    assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == str(world)
    assert env["LOCAL_RANK"] == str(rank % nproc_per_node)
    assert env["LOCAL_WORLD_SIZE"] == str(nproc_per_node)
    assert env["GROUP_RANK"] == str(node) == env["DLC_NODE_RANK"]


def stop_polite_and_stubborn(launcher: LauncherEnv, sleeper: str, cluster: str | None,
                             grace_by_engine: bool = False) -> tuple[dict, dict]:
    """Two running jobs on `cluster`, one that leaves on SIGTERM (2x2) and one that ignores it
    (2x1, 2 s grace), both stopped: the polite one within its grace, the stubborn one killed
    when its grace is over, by the launcher (a `grace over` event) or, `grace_by_engine`, by
    the engine it handed the grace to (Kubernetes: the kubelet's termination grace period).
    Returns both jobs as they ended."""
    polite = launcher.client.submit({"script": sleeper, "nodes": 2, "nproc_per_node": 2,
                                     "cluster": cluster})
    stubborn = launcher.client.submit({"script": sleeper, "args": ["--ignore-term"], "nodes": 2,
                                       "nproc_per_node": 1, "stop_grace": 2, "cluster": cluster})
    for job, world in ((polite, 4), (stubborn, 2)):
        # RUNNING, and every rank runs the script (it printed `up`, after its SIGTERM
        # choice): RUNNING alone may be a pod whose torchrun is still starting.
        wait_for(lambda job=job: launcher.client.job(job["id"])["state"] == "RUNNING", 120,
                 what="RUNNING")
        wait_for(lambda job=job, world=world: {line["rank"] for line in launcher.client.logs(job["id"])["lines"]
                                               if line["text"].startswith("up ")} == set(range(world)),
                 120, what="every rank up")
    launcher.client.stop(polite["id"])
    launcher.client.stop(stubborn["id"])
    polite = launcher.client.wait(polite["id"], timeout=60)
    stubborn = launcher.client.wait(stubborn["id"], timeout=60)
    assert polite["state"] == stubborn["state"] == "STOPPED"
    events = launcher.client.events(polite["id"])
    assert not any("grace over" in (e["reason"] or "") for e in events), [e["reason"] for e in events]
    events = launcher.client.events(stubborn["id"])
    if grace_by_engine:
        asked = next(e["t"] for e in events if (e["reason"] or "").startswith("stopped by the user"))
        assert events[-1]["t"] - asked >= 1.9, [(e["t"], e["reason"]) for e in events]
    else:
        assert any("grace over" in (e["reason"] or "") for e in events), [e["reason"] for e in events]
    return polite, stubborn
