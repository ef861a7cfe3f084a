"""Warm pools on real processes: a real launcher, real zygotes with torch imported, real
forked ranks, real gloo collectives (launcher/pools.py, engines/local/pool.py, pool_agent.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell

from conftest import LauncherEnv, assert_launcher_env, wait_for
from jupyter_dlc import clusters, formatting
from jupyter_dlc.hostprocs import process_slots
from jupyter_dlc.client import LauncherError
from jupyter_dlc.magics import DLCMagics
from test_ingest import THROUGH_NODE_REPORTERS, assert_every_step, sent_lines
from test_jobs import ENV_SCRIPT, SLEEPER, STEPS, rank_env
from test_recovery import TRAIN

# Each job of a test file imports this helper module from its workdir and records what it
# found there before setting it: a module-level global, torch's own module, the process group.
LEAK_HELPER = """
STATE = None
"""
LEAK_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
import helper
found = {"helper": helper.STATE, "torch_mark": getattr(torch, "_dlc_test_mark", None),
         "initialized": dist.is_initialized(), "threads": torch.get_num_threads(),
         "port": os.environ["MASTER_PORT"], "seed": torch.initial_seed()}
helper.STATE = os.environ["DLC_JOB_ID"]
torch._dlc_test_mark = os.environ["DLC_JOB_ID"]
dist.init_process_group("gloo", init_method="env://")
dist.barrier()
print("FOUND " + json.dumps(found), flush=True)
dist.destroy_process_group()
"""
QUICK = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
dist.barrier()
dist.destroy_process_group()
"""


def _private_launcher(tmp_path, monkeypatch, **env_vars):
    """A private launcher whose profiles file and pool lease are the test's own."""
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "clusters.yaml"))
    monkeypatch.setenv("DLC_POOL_LEASE", "10")
    for key, value in env_vars.items():
        monkeypatch.setenv(key, value)
    env = LauncherEnv(str(tmp_path))
    yield env
    env.close()
    # The launcher released its pools on SIGTERM; a failing test must not leak agents either.
    for pid in pool_agents(env):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def pooled(tmp_path, monkeypatch):
    yield from _private_launcher(tmp_path, monkeypatch)


@pytest.fixture
def pooled_restarts(tmp_path, monkeypatch):
    """Restarts go to the pool: no standby agents are warmed for them (they would win)."""
    yield from _private_launcher(tmp_path, monkeypatch, DLC_STANDBY_AGENTS="0")


def pool_agents(env: LauncherEnv) -> list[int]:
    """Pids of every process that carries one of this launcher's pool directories."""
    marker = ("DLC_POOL_DIR=" + os.path.join(env.data_dir, "pools")).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read()
                with open(f"/proc/{entry}/stat", "rb") as f:
                    zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
            except OSError:
                continue
            if not zombie and any(item.startswith(marker) for item in environ.split(b"\0")):
                found.append(int(entry))
    return found


def ready_pool(client, nodes=2, nproc=2, **options) -> dict:
    client.pool_up(nodes, nproc, **options)
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 120, what="pool ready")
    return client.pools()[0]


def ran_warm(client, job_id: str) -> bool:
    """The job's start went to a pool: its STARTING reason says so."""
    return any("; warm pool " in (e["reason"] or "") for e in client.events(job_id) if e["type"] == "state")


def run(client, script: str, **fields) -> dict:
    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 2, "max_restarts": 0,
                         **fields})
    return client.wait(job["id"], timeout=120, poll=0.1)


def test_environment_contract_on_a_warm_pool(pooled, tmp_path):
    client = pooled.client
    pool = ready_pool(client)
    assert pool["id"] == "local-2x2" and pool["engine"] == "local" and len(pool["agents"]) == 2
    script = pooled.script("envjob.py", ENV_SCRIPT)
    job = client.submit({
        "script": script, "args": ["--lr", "0.1"], "nodes": 2, "nproc_per_node": 2,
        "network": "tcp", "workdir": str(tmp_path),
        "env": {"USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0"},
    })
    job = client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    # A second attempt would mean the first failed on the pool: say why it did.
    assert job["attempt"] == 1, [(e["type"], e["reason"]) for e in client.events(job["id"])]
    assert ran_warm(client, job["id"]) and job["attempts"][0]["start"] == "warm pool local-2x2"
    assert "  start: warm pool local-2x2" in formatting.status_text(job).splitlines()
    for rank, env in rank_env(client, job["id"], 4).items():
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2) == env["DLC_NODE_RANK"]
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert_launcher_env(env, job, pooled, tmp_path)
    assert all(r["exit_code"] == 0 and r["pid"] for r in job["ranks"])
    # The pool's agents are not the ranks: fresh processes ran the job, the agents wait on.
    assert not {r["pid"] for r in job["ranks"]} & set(pool["agents"])
    after = client.pools()[0]
    assert after["state"] == "ready" and after["jobs_served"] == 1 and after["agents"] == pool["agents"]
    # Each node process is its ranks' node reporter, listening before they are forked: all
    # their reports arrive as node batches, none directly.
    go = tmp_path / "go"
    go.write_text("go")
    through = run(client, pooled.script("through.py", THROUGH_NODE_REPORTERS), env={"GO": str(go)})
    assert through["state"] == "SUCCEEDED" and ran_warm(client, through["id"]), through["reason"]
    sent = sent_lines(client, through["id"], "after")
    assert sorted(sent) == [0, 1, 2, 3] and all(via > 0 and not direct for via, direct in sent.values()), sent
    assert_every_step(client, through["id"], 4, 40)


def test_nothing_of_one_job_is_seen_by_the_next(pooled, tmp_path):
    client = pooled.client
    ready_pool(client)
    (tmp_path / "helper.py").write_text(LEAK_HELPER)
    script = pooled.script("leak.py", LEAK_SCRIPT)
    ports, seeds = [], []
    for _ in range(2):
        job = run(client, script, workdir=str(tmp_path))
        assert job["state"] == "SUCCEEDED", job["reason"]
        assert ran_warm(client, job["id"])
        found = [json.loads(line["text"][6:]) for line in client.logs(job["id"])["lines"]
                 if line["text"].startswith("FOUND ")]
        assert len(found) == 4
        ports.append({f.pop("port") for f in found})
        seeds += [f.pop("seed") for f in found]
        assert all(f == {"helper": None, "torch_mark": None, "initialized": False, "threads": 1}
                   for f in found), found
    # Each job had a store of its own (opened by the pool before the job came).
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1]
    # torch seeds its RNG afresh in every new interpreter: so must a fork of the zygote.
    assert len(set(seeds)) == 8, seeds


def test_stop_of_a_pooled_job_leaves_the_pool_ready(pooled):
    client = pooled.client
    ready_pool(client)
    sleeper = pooled.script("sleeper.py", SLEEPER)
    job = client.submit({"script": sleeper, "args": ["--ignore-term"], "nodes": 2,
                         "nproc_per_node": 2, "stop_grace": 1})
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", 60, what="RUNNING")
    assert ran_warm(client, job["id"])
    assert client.pools()[0]["state"] == "busy" and client.pools()[0]["job"] == job["id"]
    # Found without cgroups too: each forked rank shows the job in its exec'd environment.
    for rank in client.job(job["id"])["ranks"]:
        with open(f"/proc/{rank['pid']}/environ", "rb") as f:
            shown = f.read().split(b"\0")
        assert f"DLC_JOB_ID={job['id']}".encode() in shown and b"DLC_ATTEMPT=1" in shown
    client.stop(job["id"])
    job = client.wait(job["id"], timeout=60, poll=0.1)
    assert job["state"] == "STOPPED"
    wait_for(lambda: not pooled.own_processes(), 30, what="the job's processes gone")
    assert client.pools()[0]["state"] == "ready"
    after = run(client, pooled.script("quick.py", QUICK))
    assert after["state"] == "SUCCEEDED" and ran_warm(client, after["id"])


def test_kill_9_of_a_pooled_rank_then_the_next_job_runs_warm(pooled):
    client = pooled.client
    pool = ready_pool(client)
    sleeper = pooled.script("sleeper.py", SLEEPER)
    job = client.submit({"script": sleeper, "nodes": 2, "nproc_per_node": 2, "max_restarts": 0})
    wait_for(lambda: all(r["pid"] for r in client.job(job["id"])["ranks"]) and
             client.job(job["id"])["state"] == "RUNNING", 60, what="ranks up")
    victim = next(r["pid"] for r in client.job(job["id"])["ranks"] if r["rank"] == 3)
    os.kill(victim, signal.SIGKILL)
    job = client.wait(job["id"], timeout=60, poll=0.1)
    assert job["state"] == "FAILED" and "code 137" in job["reason"], job["reason"]
    after = run(client, pooled.script("quick.py", QUICK))
    assert after["state"] == "SUCCEEDED" and ran_warm(client, after["id"])
    assert client.pools()[0]["agents"] == pool["agents"]  # the same agents: none was hurt


def test_a_killed_agent_is_replaced(pooled):
    client = pooled.client
    pool = ready_pool(client)
    os.kill(pool["agents"][1], signal.SIGKILL)
    def replaced() -> bool:
        pools = client.pools()
        return bool(pools) and pools[0]["state"] == "ready" and not set(pools[0]["agents"]) & set(pool["agents"])

    wait_for(replaced, 120, what="pool replaced")
    job = run(client, pooled.script("quick.py", QUICK))
    assert job["state"] == "SUCCEEDED" and ran_warm(client, job["id"]), job["attempts"][0]["start"]


def test_a_busy_pool_sends_the_second_job_cold(pooled):
    client = pooled.client
    ready_pool(client, 1, 1)
    sleeper = pooled.script("sleeper.py", SLEEPER)
    first = client.submit({"script": sleeper, "nodes": 1, "nproc_per_node": 1})
    wait_for(lambda: client.job(first["id"])["state"] == "RUNNING", 60, what="RUNNING")
    second = client.submit({"script": pooled.script("quick.py", QUICK), "nodes": 1,
                            "nproc_per_node": 1})
    second = client.wait(second["id"], timeout=120, poll=0.1)
    assert second["state"] == "SUCCEEDED" and not ran_warm(client, second["id"])
    reasons = [e["reason"] for e in client.events(second["id"]) if e["type"] == "state"]
    assert any(f"pool local-1x1 is busy with {first['id']}" in (r or "") for r in reasons), reasons
    assert second["attempts"][0]["start"] == f"cold start (pool local-1x1 is busy with {first['id']})"
    client.stop(first["id"], grace=0)


def test_idle_pool_is_released(pooled):
    client = pooled.client
    ready_pool(client, 1, 2, idle_timeout=2)
    wait_for(lambda: not client.pools(), 60, what="pool released")
    wait_for(lambda: not pool_agents(pooled), 30, what="agents gone")


def test_launcher_kill_9_readopts_the_pool_then_a_lost_launcher_leaves_nothing(pooled, monkeypatch):
    client = pooled.client
    pool = ready_pool(client)
    steps = client.submit({"script": pooled.script("steps.py", STEPS), "nodes": 2,
                           "nproc_per_node": 2, "max_restarts": 0})
    wait_for(lambda: (client.job(steps["id"])["last_step"] or 0) >= 2, 120, what="training")
    pooled.restart(kill=True)  # with a job running on the pool
    client = pooled.client
    again = client.pools()
    assert [p["id"] for p in again] == ["local-2x2"] and again[0]["agents"] == pool["agents"]
    steps = client.wait(steps["id"], timeout=180, poll=0.1)
    assert steps["state"] == "SUCCEEDED" and steps["last_step"] == 40, steps["reason"]
    assert steps["attempts"][0]["start"] == "warm pool local-2x2"
    job = run(client, pooled.script("quick.py", QUICK))
    assert job["state"] == "SUCCEEDED" and ran_warm(client, job["id"])
    # No launcher comes back: the agents leave once their lease (10 s here) runs out.
    os.kill(pooled.pid(), signal.SIGKILL)
    wait_for(lambda: not pool_agents(pooled), 60, what="agents gone with their lease")


def test_pool_commands_and_bad_input(pooled, tmp_path):
    client = pooled.client
    clusters.put_profile("k8s", {"engine": "kubernetes", "namespace": "ml"})
    with pytest.raises(LauncherError) as error:
        client.pool_up(1, 1, cluster="k8s")
    assert error.value.status == 400 and "kubernetes cannot hold a warm pool" in str(error.value)
    with pytest.raises(LauncherError) as error:
        client.request("POST", "/api/pools", body={"nodes": 0, "nproc_per_node": 1})
    assert error.value.status == 400 and str(error.value).startswith("nodes:")
    with pytest.raises(LauncherError) as error:
        client.release_pool("nope-1x1")
    assert error.value.status == 404
    slots = process_slots()[0]  # the launcher's, from the same machine and environment
    client.pool_up(1, slots)  # one agent; its jobs would fill the machine
    with pytest.raises(LauncherError) as error:
        client.pool_up(1, 1)
    assert error.value.status == 400 and f"with {slots} held by other pools" in str(error.value)
    assert client.pool_down() == [f"local-1x{slots}"]
    client.pool_up(1, 1)
    client.pool_up(1, 2)
    assert client.pool_down(nproc_per_node=2) == ["local-1x2"]
    assert [p["id"] for p in client.pools()] == ["local-1x1"]
    assert client.pool_down() == ["local-1x1"] and client.pools() == []
    wait_for(lambda: not pool_agents(pooled), 30, what="agents gone")


def test_a_profile_starts_a_pool_on_the_first_job(pooled):
    client = pooled.client
    clusters.put_profile("here", {"engine": "local", "pool": True, "pool_idle_timeout": "5m"})
    quick = pooled.script("quick.py", QUICK)
    first = run(client, quick, cluster="here")
    assert first["state"] == "SUCCEEDED" and not ran_warm(client, first["id"])
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 120, what="pool ready")
    pool = client.pools()[0]
    assert pool["id"] == "here-2x2" and pool["cluster"] == "here" and pool["idle_timeout"] == 300
    second = run(client, quick, cluster="here")
    assert second["state"] == "SUCCEEDED" and ran_warm(client, second["id"])


def test_pool_up_status_down_from_the_cli_and_the_magic(pooled, capsys):
    cli = [sys.executable, "-m", "jupyter_dlc.cli", "pool"]

    def run_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(cli + list(args), capture_output=True, text=True, env=dict(os.environ),
                              timeout=60)

    missing = run_cli("up", "--nodes", "1")
    assert missing.returncode == 2 and "nodes: pool up needs the shape" in missing.stderr
    up = run_cli("up", "--nodes", "1", "--nproc-per-node", "2", "--idle-timeout", "900")
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[0].split() == ["POOL", "STATE", "JOB", "SERVED", "IDLE",
                                                 "RELEASED", "AFTER", "NODE-HOURS", "HOLDS"]
    assert up.stdout.splitlines()[1].startswith("local-1x2") and "900s idle" in up.stdout
    shell = InteractiveShell.instance()
    shell.register_magics(DLCMagics)
    shell.run_line_magic("dlc", "pool status")
    assert "local-1x2" in capsys.readouterr().out
    shell.run_line_magic("dlc", "pool down --nproc-per-node 2")
    assert capsys.readouterr().out.strip() == "released local-1x2"
    status = run_cli("status")
    assert status.returncode == 0 and status.stdout.startswith("no warm pools")


def test_a_graceful_stop_on_the_pool_checkpoints_and_the_node_records_its_exit(pooled):
    """SIGTERM reaches the ranks (the runtime saves at the step boundary and leaves); the
    pool's node process outlives them through the grace and records the node's exit."""
    client = pooled.client
    ready_pool(client, 1, 2)
    job = client.submit({"script": pooled.script("train.py", TRAIN), "args": ["400", "0.05"],
                         "nodes": 1, "nproc_per_node": 2, "heartbeat_interval": 1})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 13, 120, what="step 13")
    client.stop(job["id"], grace=30)
    stopped = client.wait(job["id"], timeout=90, poll=0.1)
    assert stopped["state"] == "STOPPED" and "checkpoint committed" in stopped["reason"], stopped["reason"]
    assert stopped["attempts"][0]["start"] == "warm pool local-1x2"
    assert [c["step"] for c in client.checkpoints(job["id"])][-1] == stopped["last_step"]
    with open(os.path.join(stopped["job_dir"], "attempt-1", "node-0.exit")) as f:
        assert f.read().strip() == "0"
    assert client.pools()[0]["state"] == "ready"
