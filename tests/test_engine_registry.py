"""The engine registry is open: `tests/engine_plugin/` holds a small engine (`tiny_engine.py`)
and the metadata of a distribution that registers it in the `jupyter_dlc.engines` entry-point
group, and nothing else. With that folder on PYTHONPATH, a real launcher, the CLI and the
clusters file take the engine as one of their own: its profile option is validated, a job
runs on it to the end, `--dry-run` names it, and the OpenAPI document describes its profile.
Without the folder, nothing of it is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import LauncherEnv

from jupyter_dlc import clusters
from jupyter_dlc import engine_registry as engines
from jupyter_dlc.spec import JobSpec, SpecError

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_plugin")

SCRIPT = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
print("greeting", os.environ.get("TINY_GREETING"), "rank", dist.get_rank(), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def plugged(tmp_path, monkeypatch):
    """The plugin folder on this process's path and on every child's PYTHONPATH, a profile
    file of our own, and a launcher started after both; all undone after."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (PLUGIN, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    monkeypatch.syspath_prepend(PLUGIN)
    engines.refresh()
    launcher = LauncherEnv(str(tmp_path / "launcher"))
    yield launcher
    launcher.close()
    monkeypatch.undo()
    engines.refresh()


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", *args], capture_output=True,
                            text=True, timeout=180, env=os.environ)
    assert not check or result.returncode == 0, result.stdout + result.stderr
    return result


def test_an_engine_registered_by_an_entry_point_runs_a_job(plugged, tmp_path):
    assert engines.names()[-1] == "tiny" and engines.names()[0] == "local"
    # Its profile option is checked as a built-in engine's are: one line naming the field.
    with pytest.raises(clusters.ClusterError, match=r"bad\.greeting: expected words every rank gets"):
        clusters.put_profile("bad", {"engine": "tiny", "greeting": 3})
    with pytest.raises(clusters.ClusterError, match=r"bad\.hosts: unknown option for engine tiny; known: "):
        clusters.put_profile("bad", {"engine": "tiny", "hosts": ["h1"]})
    clusters.put_profile("tiny1", {"engine": "tiny", "greeting": "hello from a plugin"})
    JobSpec.from_dict({"script": "/x.py", "engine": "tiny"})  # the spec knows it too

    script = plugged.script("greet.py", SCRIPT)
    dry = _cli("run", script, "--cluster", "tiny1", "--nodes", "2", "--dry-run").stdout
    assert "what the tiny engine would be asked" in dry and "TINY_GREETING='hello from a plugin'" in dry
    ran = _cli("run", script, "--cluster", "tiny1", "--nodes", "2", "--wait")
    job_id = ran.stdout.split()[0]
    job = plugged.client.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["spec"]["engine"] == "tiny", job["reason"]
    logs = [line["text"] for line in plugged.client.logs(job_id)["lines"]]
    assert sorted(line for line in logs if line.startswith("greeting")) == [
        f"greeting hello from a plugin rank {r}" for r in range(2)], logs
    # What it cannot do for the job, the views say (the panel's detail turns Branch off).
    assert job["engine_report"]["name"] == "tiny" and job["engine_report"]["capabilities"]["branches"] is False
    assert {c["capability"] for c in job["engine_report"]["cannot"]} == {"branches", "warm_pools",
                                                                 "standby_agents", "node_copies"}
    status = _cli("status", job_id).stdout
    assert "not on tiny for this job: Warm restarts" in status and "Branch from another job" in status
    from jupyter_dlc.widgets import JobView

    view = JobView(plugged.client, job_id)
    assert view.refresh_now() and 'class="dlc-engine-limits">not on tiny for this job' in view.header.value
    view.close()
    # --engine takes it where argparse checks choices (a fresh process reads the registry);
    # --backend, the old spelling, still does, with a note.
    assert _cli("run", script, "--engine", "tiny", "--dry-run").returncode == 0
    old = _cli("run", script, "--backend", "tiny", "--dry-run")
    assert old.returncode == 0 and "--backend is now --engine" in old.stderr

    document = json.loads(subprocess.run([sys.executable, "-m", "jupyter_dlc.launcher.openapi"], capture_output=True,
                                         text=True, check=True, timeout=60, env=os.environ).stdout)
    [tiny] = [b for b in document["components"]["schemas"]["ClusterProfile"]["oneOf"] if b["title"] == "tiny"]
    assert tiny["properties"]["greeting"]["type"] == "string"


def test_without_the_plugin_nothing_of_it_is_known():
    assert "tiny" not in engines.names()
    with pytest.raises(SpecError, match=r"^engine: expected one of local, kubernetes, slurm, ssh, got 'tiny'"):
        JobSpec.from_dict({"script": "/x.py", "engine": "tiny"})
    with pytest.raises(engines.UnknownEngine, match="not an engine here; engines: local, kubernetes"):
        engines.engine_class("tiny")


def test_an_engine_that_leaves_out_a_method_of_the_contract_is_refused_when_made():
    """The contract's methods every engine must have are abstract: a class missing one
    cannot be made, so it fails where it is registered, not at a user's first stop."""
    from jupyter_dlc.engines.contract import DryRun, Engine

    class Half(Engine):
        name = "half"

        def dry_run(self, ctx):
            return DryRun(self.name)

        def submit(self, ctx, request):
            return {}

    with pytest.raises(TypeError, match="abstract method.*(describe|kill|stop)"):
        Half()
