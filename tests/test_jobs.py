"""Real jobs through a real launcher: real torchrun agents, real ranks, real SQLite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import assert_launcher_env, wait_for
from jupyter_dlc.client import LauncherClient, LauncherError

ENV_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")   # as a PyTorchJob / PAI-DLC script does
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
keys = ("RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT "
        "DLC_JOB_ID DLC_JOB_NAME DLC_ATTEMPT DLC_NNODES DLC_NODE_RANK DLC_LAUNCHER_URL DLC_TOKEN "
        "DLC_JOB_DIR DLC_CHECKPOINT_DIR DLC_RESUME_PATH EASYCKPT_RESUME_PATH NCCL_IB_DISABLE "
        "NCCL_SOCKET_IFNAME TORCH_FR_BUFFER_SIZE TORCH_NCCL_DUMP_ON_TIMEOUT USER_VAR").split()
# One write, newline included: unbuffered (an exported bundle sets PYTHONUNBUFFERED), print
# writes the text and its newline apart, and two ranks sharing a node's log interleave them.
sys.stdout.write("ENV " + json.dumps({k: os.environ.get(k) for k in keys} | {"sum": total.item(),
                 "argv": sys.argv[1:], "cwd": os.getcwd(),
                 "program": open("/proc/self/cmdline").read().split("\\0")[1:4]}) + "\\n")
sys.stdout.flush()
"""

# 40 steps of 0.2 s, each logged: long enough to kill a launcher mid-job and see it adopted.
STEPS = """
import time
from jupyter_dlc import runtime
info = runtime.init()
for step in range(1, 41):
    time.sleep(0.2)
    runtime.log(step, loss=1.0 / step)
"""

SLEEPER = """
import os, signal, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", os.getpid(), flush=True)
while True:
    time.sleep(0.1)
"""


def rank_env(client: LauncherClient, job_id: str, world: int) -> dict[int, dict]:
    found = {}
    for line in client.logs(job_id)["lines"]:
        if line["text"].startswith("ENV "):
            found[line["rank"]] = json.loads(line["text"][4:])
    assert sorted(found) == list(range(world)), f"ENV lines from ranks {sorted(found)}"
    return found


def test_environment_contract_on_2x2(launcher, tmp_path):
    script = launcher.script("envjob.py", ENV_SCRIPT)
    job = launcher.client.submit({
        "script": script, "args": ["--lr", "0.1"], "nodes": 2, "nproc_per_node": 2,
        "network": "tcp", "workdir": str(tmp_path),
        "env": {"USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0"},  # --env wins over the profile
    })
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    envs = rank_env(launcher.client, job["id"], 4)
    for rank, env in envs.items():
        node = rank // 2
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(node) == env["DLC_NODE_RANK"]
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert_launcher_env(env, job, launcher, tmp_path)
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert all(r["exit_code"] == 0 and r["pid"] for r in ranks.values())
    states = [e["state"] for e in launcher.client.events(job["id"]) if e["type"] == "state"]
    assert states == ["QUEUED", "PREFLIGHT", "STARTING", "RUNNING", "SUCCEEDED"]
    with open(os.path.join(job["job_dir"], "script.py")) as f:
        assert f.read() == open(script).read()  # what ran is on record


def test_stop_leaves_no_process_behind(launcher):
    script = launcher.script("sleeper.py", SLEEPER)
    polite = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2})
    stubborn = launcher.client.submit({"script": script, "args": ["--ignore-term"], "nodes": 1,
                                       "nproc_per_node": 2, "stop_grace": 2})
    for job in (polite, stubborn):
        wait_for(lambda job=job: launcher.client.job(job["id"])["state"] == "RUNNING", 60, what="RUNNING")
    # Two jobs at once: distinct rendezvous ports and directories.
    assert polite["job_dir"] != stubborn["job_dir"]
    launcher.client.stop(polite["id"])
    launcher.client.stop(stubborn["id"])
    polite = launcher.client.wait(polite["id"], timeout=30)
    stubborn = launcher.client.wait(stubborn["id"], timeout=30)
    assert polite["state"] == stubborn["state"] == "STOPPED"
    assert any("SIGKILL" in (e["reason"] or "") for e in launcher.client.events(stubborn["id"]))
    assert launcher.own_processes() == []


def test_job_survives_launcher_kill_9(launcher):
    script = launcher.script("steps.py", STEPS)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "heartbeat_interval": 1})
    wait_for(lambda: (launcher.client.job(job["id"])["last_step"] or 0) >= 5, 60, what="step 5")
    old_pid = launcher.pid()
    old_url = launcher.client.url
    launcher.restart(kill=True)
    assert launcher.pid() != old_pid and launcher.client.url == old_url
    final = launcher.client.wait(job["id"], timeout=90)
    assert final["state"] == "SUCCEEDED", final["reason"]
    assert final["last_step"] == 40  # reports reached the new launcher
    assert launcher.own_processes() == []


def test_failing_rank_fails_the_job_with_its_exit_code(launcher):
    script = launcher.script("fail.py", """
        import os, sys, time
        import torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 2:
            sys.exit(3)
        dist.barrier()
        """)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2,
                                  "max_restarts": 0})
    job = launcher.client.wait(job["id"], timeout=90)
    assert job["state"] == "FAILED"
    assert "rank 2 exited with code 3" in job["reason"]
    assert {r["rank"]: r["exit_code"] for r in job["ranks"]}[2] == 3
    assert launcher.own_processes() == []


def test_every_route_refuses_without_the_token(launcher):
    from jupyter_dlc.launcher.app import make_app

    app = make_app(launcher=None)
    probes = {r"/healthz": "/healthz", r"/metrics": "/metrics", r"/api/stream": "/api/stream",
              r"/api/jobs": "/api/jobs"}
    paths = []
    for rule in app.wildcard_router.rules:
        pattern = rule.matcher.regex.pattern.rstrip("$")
        path = probes.get(pattern) or pattern.replace("([^/]+)", "somejob").replace(
            "(stop|resume|clone)", "stop").replace(".*", "nothing")
        paths.append(path)
    assert len(paths) >= 14
    import urllib.error
    import urllib.request

    for path in paths:
        for method in ("GET", "POST", "DELETE"):
            req = urllib.request.Request(launcher.client.url + path, method=method,
                                         data=b"{}" if method == "POST" else None,
                                         headers={"Authorization": "token wrong"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=5)
            assert refused.value.code in (401, 405), (method, path, refused.value.code)
            if refused.value.code == 405:  # the method does not exist on that route at all
                continue
            assert refused.value.code == 401, (method, path)


def test_bad_specs_get_one_line_errors(launcher, tmp_path):
    script = launcher.script("ok.py", "print('hi')\n")
    cases = [
        ({"script": script, "nodes": 0}, "nodes: must be between 1 and 1024"),
        ({"script": script, "nproc_per_node": "two"}, "nproc_per_node: expected a whole number"),
        ({"script": script, "env": {"RANK": "3"}}, "env: RANK is set by torchrun"),
        ({"script": script, "network": "rdma:ib0:1"}, "network: expected tcp, rdma, debug, an interface name"),
        ({"script": script, "max_runtime": "soon"}, "max_runtime: expected a duration"),
        ({"script": script, "progress_timeout": "10s", "heartbeat_interval": "5s"},
         "progress_timeout: 10s must be longer than the heartbeat verdict"),
        ({"script": script, "collective_timeout": "5m"}, "collective_timeout: 5m must be longer"),
        ({"script": str(tmp_path / "missing.py")}, "script:"),
        ({"code": "   "}, "code: the cell is empty"),
        ({"script": script, "bogus": 1}, "bogus: unknown field"),
        ({"script": script, "nodes": 64, "nproc_per_node": 64}, "exceed what this machine can run"),
    ]
    before = launcher.client.jobs()
    for body, expected in cases:
        status, answer = None, None
        try:
            launcher.client.request("POST", "/api/jobs", body=body)
        except LauncherError as error:
            status, answer = error.status, str(error)
        assert status == 400, body
        assert expected in answer and "\n" not in answer, (expected, answer)
    assert launcher.client.jobs() == before  # nothing stored, nothing lost


def test_cli_run_wait_and_commands(launcher, tmp_path):
    ok = launcher.script("ok.py", "import sys; print('args', sys.argv[1:])\n")
    bad = launcher.script("bad.py", "raise SystemExit(4)\n")
    env = dict(os.environ)
    cli = [sys.executable, "-m", "jupyter_dlc.cli"]
    run = subprocess.run(cli + ["run", ok, "a", "--nodes", "1", "--nproc-per-node", "2", "--wait",
                                "--", "--flag"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().splitlines()[0]
    assert "args ['a', '--flag']" in run.stderr
    failed = subprocess.run(cli + ["run", bad, "--max-restarts", "0", "--wait"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert failed.returncode == 1 and "FAILED" in failed.stderr
    listing = subprocess.run(cli + ["list"], capture_output=True, text=True, env=env).stdout
    assert job_id in listing and "SUCCEEDED" in listing and "FAILED" in listing
    status = json.loads(subprocess.run(cli + ["status", job_id, "--json"], capture_output=True,
                                       text=True, env=env).stdout)
    assert status["state"] == "SUCCEEDED" and len(status["ranks"]) == 2
    logs = subprocess.run(cli + ["logs", job_id, "--rank", "1"], capture_output=True, text=True,
                          env=env).stdout
    assert "args ['a', '--flag']" in logs
    usage = subprocess.run(cli + ["run", ok, "--nodes", "zero"], capture_output=True, text=True,
                           env=env)
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) <= 3
    missing = subprocess.run(cli + ["status", "nope"], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and missing.stderr.strip() == \
        "jupyter-dlc: job: no job 'nope'; `jupyter-dlc list` shows the jobs"
    status = subprocess.run(cli + ["launcher", "status"], capture_output=True, text=True, env=env)
    assert status.returncode == 0 and launcher.client.url in status.stdout


def test_launcher_connection_file_is_private(launcher):
    from jupyter_dlc import paths

    path = paths.connection_file(launcher.data_dir, launcher.runtime_dir)
    assert os.stat(path).st_mode & 0o777 == 0o600
    with open(path) as f:
        info = json.load(f)
    assert info["url"].startswith("http://127.0.0.1:") and info["token"] == launcher.client.token


CHECKPOINTED_STEPS = """
import time
import torch
from jupyter_dlc import runtime
info = runtime.init()
model = torch.nn.Linear(2, 2)
ckpt = runtime.Checkpointer(model=model)
for step in range(1, 200):
    time.sleep(0.2)
    runtime.log(step, loss=1.0 / step)
"""


@pytest.mark.parametrize("script, note", [
    (STEPS, "stopped; no checkpoint: the script has no runtime.Checkpointer"),
    (CHECKPOINTED_STEPS, "before exit"),
])
def test_a_stop_says_what_was_saved(launcher, script, note):
    """Issue 26: a stop of a job without a Checkpointer said "a checkpoint committed before
    exit". The reason now says what the ranks did: no checkpoint, or the step committed."""
    client = launcher.client
    job = client.submit({"script": launcher.script("steps.py", script), "name": "saver"})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 2, 90, what="step 2")
    client.stop(job["id"])
    done = client.wait(job["id"], timeout=60)
    assert done["state"] == "STOPPED"
    assert note in done["reason"], done["reason"]
    committed = [c["step"] for c in client.checkpoints(job["id"])]
    if script is STEPS:
        assert committed == [] and "committed" not in done["reason"]
    else:
        assert f"checkpoint committed at step {committed[-1]} before exit" in done["reason"]
