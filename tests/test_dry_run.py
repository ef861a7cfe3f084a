"""`--dry-run` on `jupyter-dlc run` and `%%dlc`: a real launcher on loopback checks the spec as a
submit does and answers the engine's native request for the first attempt, storing nothing.
The local engine's command lines, an SSH profile's per-host ssh commands and payloads, and a
Kubernetes profile's manifests (made offline: no API server runs here, and none is asked) are
read back from the CLI's output, from a kernel's (nbclient), and from the route itself
against the OpenAPI document. Slurm's batch script is checked in tests/test_slurm.py, where a
cluster runs (its capacity check asks sinfo)."""

from __future__ import annotations

import json
import re
import os

import pytest
import yaml
from test_notebook import run_notebook, text
from test_openapi import validator

from jupyter_dlc import cli, clusters
from jupyter_dlc.client import LauncherError
from jupyter_dlc.launcher.openapi import document

SCRIPT = "import torch\nprint('trained')\n"


def _jobs_dir(launcher) -> list[str]:
    path = os.path.join(launcher.data_dir, "jobs")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _nothing_stored(launcher) -> None:
    assert launcher.client.jobs() == []
    assert _jobs_dir(launcher) == []
    scratch = os.path.join(launcher.data_dir, "dry-runs", "jobs")
    assert not os.path.isdir(scratch) or os.listdir(scratch) == []


def test_the_local_request_is_printed_and_nothing_is_submitted(launcher, tmp_path, capsys):
    script = launcher.script("train.py", SCRIPT)
    code = cli.main(["run", script, "--nodes", "2", "--nproc-per-node", "2", "--dry-run",
                     "--env", "GREETING=hello world", "--env", "HOSTILE=$(id); `id` 'x\"",
                     "--", "--lr", "0.1"])
    out = capsys.readouterr().out
    assert code == 0, out
    header, *lines = out.splitlines()
    job_id = header.split("for job ")[1].split(",")[0]
    assert header.startswith("# --dry-run: what the local engine would be asked") and "nothing was submitted" in header
    node1 = lines[lines.index("# node 1:") + 1]
    assert "-m torch.distributed.run --nnodes=2 --node-rank=1 --nproc-per-node=2" in node1
    job_dir = os.path.join(launcher.data_dir, "jobs", job_id)
    assert node1.endswith(f"{job_dir}/script.py --lr 0.1"), node1  # the job's paths, not scratch
    # The job's environment, quoted as a shell reads it; secrets are placeholders, and the
    # launcher's own environment (PATH, HOME) is not repeated.
    assert "GREETING='hello world'" in lines
    assert "HOSTILE='$(id); `id` '\"'\"'x\"'" in lines
    assert f"DLC_JOB_ID={job_id}" in lines and "DLC_NNODES=2" in lines
    assert "DLC_TOKEN='<job token: made at submit>'" in lines
    assert "DLC_LAUNCHER_PROOF='<proof key: made at submit>'" in lines
    assert not [line for line in lines if line.startswith(("PATH=", "HOME="))]
    _nothing_stored(launcher)

    # What a submit refuses, a dry run refuses the same way: one line naming the field.
    assert cli.main(["run", script, "--nproc-per-node", "4096", "--dry-run"]) == 2
    assert "nproc_per_node" in capsys.readouterr().err
    _nothing_stored(launcher)


def test_the_route_answers_the_documented_shape_and_refuses_a_bad_flag(launcher):
    script = launcher.script("train.py", SCRIPT)
    answer = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 1}, dry_run=True)
    errors = list(validator("DryRun", document()).iter_errors(answer))
    assert not errors, errors[0].message
    assert answer["engine"] == "local" and len(answer["request"]["commands"]) == 1
    with pytest.raises(LauncherError, match="^dry_run: '2' is not 1 or 0"):
        launcher.client.request("POST", "/api/jobs", params={"dry_run": 2},
                                body={"script": script, "nodes": 1, "nproc_per_node": 1})
    _nothing_stored(launcher)


def test_ssh_and_kubernetes_requests_need_no_host_and_no_api(launcher, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    clusters.put_profile("two-hosts", {"engine": "ssh", "hosts": ["127.0.0.1", "127.0.0.2"],
                                       "shared_filesystem": True})
    clusters.put_profile("k8s", {"engine": "kubernetes", "namespace": "ml", "image": "python:3.11"})
    launcher.restart(kill=False)  # it reads the profiles file from its environment
    script = launcher.script("train.py", SCRIPT)

    assert cli.main(["run", script, "--nodes", "2", "--cluster", "two-hosts", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "what the ssh engine would be asked" in out and "# cluster profile: two-hosts" in out
    for host in ("127.0.0.1", "127.0.0.2"):
        ssh = out.splitlines()[out.splitlines().index(f"# node on {host}:") + 1]
        assert ssh.startswith("ssh ") and f"-- {host} " in ssh and "jupyter_dlc.node.ssh_node run" in ssh
    payloads = json.loads(out.split("# payloads:\n", 1)[1])
    assert [p["env"]["DLC_NODE_RANK"] for p in payloads] == ["0", "1"]
    assert all("DLC_TOKEN" not in p["env"] for p in payloads)  # the token joins at submit only

    assert cli.main(["run", script, "--nodes", "2", "--cluster", "k8s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # Each manifest a file of its own, as `kubectl apply -f` takes them.
    sections = re.split(r"^# (\d\d-[a-z]+\.yaml):$", out.split("\n# kind:", 1)[0], flags=re.M)
    manifests = [yaml.safe_load(text) for text in sections[2::2]]
    assert [f"{i:02d}-{m['kind'].lower()}.yaml" for i, m in enumerate(manifests)] == sections[1::2]
    kinds = {m["kind"] for m in manifests}
    assert {"ConfigMap", "Job"} <= kinds, kinds
    assert all(m["metadata"]["namespace"] == "ml" for m in manifests)
    [job] = [m for m in manifests if m["kind"] == "Job"]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    # The token reaches the pods from the Secret a submit creates, never in a manifest.
    assert env["DLC_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert "<job token" not in out
    _nothing_stored(launcher)


def test_the_cell_magic_prints_the_request_in_the_notebook(launcher, tmp_path):
    nb = run_notebook([
        "%load_ext jupyter_dlc",
        "%%dlc --nodes 2 --dry-run\nimport torch\nprint('trained')",
        "%%dlc --dry-run --sweep lr=0.1,0.01,0.001\nfrom jupyter_dlc import runtime\nprint(runtime.params())",
        "%dlc list",
    ], str(tmp_path))
    shown = text(nb.cells[1])
    assert "what the local engine would be asked" in shown and "# node 1:" in shown, shown
    sweep = text(nb.cells[2])
    assert "DLC_PARAM_LR=0.1" in sweep and "# and 2 more trial(s) like it: lr=0.01; lr=0.001" in sweep, sweep
    assert "no jobs" in text(nb.cells[3])
    _nothing_stored(launcher)
