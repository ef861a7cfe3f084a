"""The engine conformance suite (issue 21), after TorchX's one integration suite per
scheduler: the same user-level scenarios, written once, run on every engine configuration of
`rigs.CONFIGS` (local cold and on a warm pool, Slurm cold, on a warm pool and without a shared
filesystem, SSH hosts with and without a shared filesystem, Kubernetes against the API
stand-in: a stand-in, because no API server can run on these machines; see rigs.py for what
each cluster is).

One cluster and one launcher per configuration, and one trained job that the scenarios
which only read it share (the environment contract, metrics and logs, the checkpoint list,
export, a resume from a picked step; delete last). Where an engine cannot do a scenario it
declares so in its `Capabilities`, and the scenario checks the declaration: that the engine
refuses cleanly, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest
import torch
from conftest import (
    LauncherEnv,
    assert_launcher_env,
    assert_torchrun_env,
    env_contract_spec,
    stop_polite_and_stubborn,
    wait_for,
)
from rigs import CONFIGS, KINDS, Rig, profile_options, start_pool
from test_jobs import ENV_SCRIPT, SLEEPER, rank_env
from test_jobs import STEPS as STEPS_40
from test_ssh import FAILS_ON_RANK_3 as FAILS
from test_recovery import TRAIN

from jupyter_dlc.client import LauncherError

# The env-contract job and a deterministic training run in one script: the step count and
# pause come from the environment (the arguments are the contract's `--lr 0.1`), the final
# parameters go beside the checkpoints, where the launcher sees them on every engine.
TRAINED = TRAIN.replace("total = int(sys.argv[1])\npause = float(sys.argv[2])\n",
                        'total = int(os.environ["TOTAL"])\npause = float(os.environ["PAUSE"])\n').replace(
    "info = runtime.init()\n", "info = runtime.init()\n" + ENV_SCRIPT.replace(
        'dist.init_process_group("gloo", init_method="env://")', "").replace("total", "rank_sum")).replace(
    'torch.save(model.state_dict(), os.path.join(os.environ["DLC_JOB_DIR"], "final.pt"))',
    'torch.save(model.state_dict(), os.path.join(os.environ["DLC_CHECKPOINT_DIR"], "final.pt"))')
# With HOLD set, every rank waits at step 12 (step 10 committed) until that file exists:
# the kill -9 scenario kills a rank there, however long the other scenarios took.
LOGGED = "        runtime.log(step, loss=loss.item())\n"
TRAINED = TRAINED.replace(LOGGED, LOGGED + """\
        while step == 12 and os.environ.get("HOLD") and not os.path.exists(os.environ["HOLD"]):
            time.sleep(0.05)
""")
assert "TOTAL" in TRAINED and "DLC_CHECKPOINT_DIR\"], \"final.pt\"" in TRAINED and "HOLD" in TRAINED
STEPS_TOTAL = 30  # checkpoints at 10, 20, 30

# test_jobs' STEPS, 20 steps of 0.2 s: long enough to kill a launcher mid-job.
STEPS = STEPS_40.replace("range(1, 41)", "range(1, 21)")
assert "range(1, 21)" in STEPS


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """The clusters up so far, one of each kind, kept while configurations of that kind run
    (pytest groups a module's tests by configuration) and brought down at the next kind."""
    held: dict[str, tuple[contextlib.ExitStack, object]] = {}

    def up(kind: str):
        if kind not in held:
            for stack, _ in held.values():
                stack.close()
            held.clear()
            stack = contextlib.ExitStack()
            held[kind] = (stack, stack.enter_context(KINDS[kind](tmp_path_factory.mktemp(kind))))
        return held[kind][1]

    yield up
    for stack, _ in held.values():
        stack.close()


@pytest.fixture(scope="module", params=CONFIGS, ids=[c.id for c in CONFIGS])
def rig(request, kinds, tmp_path_factory):
    config = request.param
    cluster = kinds(config.kind)
    launcher = LauncherEnv(str(tmp_path_factory.mktemp(config.id)))
    try:
        rig = Rig(config, cluster, launcher, profile_options(cluster, config, launcher))
        if config.pool:
            start_pool(rig)
        yield rig
        if config.pool:
            rig.client.pool_down(**({"cluster": rig.profile} if rig.profile else {}))
    finally:
        launcher.close()


def final_params(rig: Rig, job: dict) -> dict:
    with open(os.path.join(job["attempts"][-1]["checkpoint_dir"], "final.pt"), "rb") as f:
        return torch.load(f)


def assert_equal_params(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def ran_warm(rig: Rig, job_id: str) -> bool:
    return any("; warm pool " in (e["reason"] or "") for e in rig.client.events(job_id) if e["type"] == "state")


def nothing_left(rig: Rig, *jobs: dict) -> None:
    """No process of these jobs is left on any node (every node is this machine)."""
    from jupyter_dlc.hostprocs import job_processes

    ids = {job["id"] for job in jobs}
    wait_for(lambda: not [key for key in job_processes() if key[0] in ids], 60,
             what="no process of the jobs anywhere")


@pytest.fixture(scope="module")
def trained(rig, tmp_path_factory):
    """The job the reading scenarios share: the env contract's 2x2 job, trained 30 steps
    with a checkpoint every 10, and its final parameters (a clean run's)."""
    cwd = tmp_path_factory.mktemp(f"{rig.config.id}-cwd")
    script = rig.launcher.script("trained.py", TRAINED)
    job = rig.client.submit(env_contract_spec(script, cwd, **rig.spec(), env={
        "USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0", "TOTAL": str(STEPS_TOTAL), "PAUSE": "0"}))
    # The kill -9 scenario's job runs beside it (a warm pool serves one job at a time: there
    # it starts once this one has ended, so that both its attempts run on the pool).
    faulty = None if rig.config.pool else submit_faulty(rig, script, cwd)
    job = rig.client.wait(job["id"], timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    faulty = faulty or submit_faulty(rig, script, cwd)
    yield {"job": job, "cwd": cwd, "params": final_params(rig, job), "script": script, "faulty": faulty}
    open(os.path.join(cwd, "go"), "w").close()  # a kill -9 scenario that did not run holds it no more
    if rig.client.job(faulty["id"])["state"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
        rig.client.stop(faulty["id"], grace=0)


def submit_faulty(rig: Rig, script: str, cwd) -> dict:
    """The trained job again, with restarts, held at step 12 until `cwd/go` exists."""
    return rig.client.submit(env_contract_spec(script, cwd, **rig.spec(), name="faulty", max_restarts=2,
                                               heartbeat_interval=1, env={
        "USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0", "TOTAL": str(STEPS_TOTAL), "PAUSE": "0",
        "HOLD": os.path.join(cwd, "go")}))


def test_environment_contract(rig, trained):
    job, cwd = trained["job"], trained["cwd"]
    caps = rig.capabilities()
    shared = caps.shared_filesystem
    assert job["spec"]["engine"] == rig.config.engine
    assert ran_warm(rig, job["id"]) == rig.config.pool
    checkpoint_dir = job["attempts"][0]["checkpoint_dir"]
    for rank, env in rank_env(rig.client, job["id"], 4).items():
        assert_torchrun_env(env, rank)
        # Without a shared filesystem the ranks' job directory is one of their own; the
        # checkpoint directory is the one the engine resolved, which the launcher sees too.
        assert_launcher_env(env, job, rig.launcher, cwd if caps.workdir else None,
                            job_dir=None if shared else env["DLC_JOB_DIR"], checkpoint_dir=checkpoint_dir)
        if not shared:
            assert env["DLC_JOB_DIR"] != job["job_dir"]
        if not caps.workdir:  # as declared: the pod's own working directory
            assert env["cwd"] != str(cwd)
        if not rig.config.pool:
            # A cold start on every engine: the node's agent imported torch once and forked
            # its ranks (engines/torchrun.py node_agent_argv), so the rank runs its program.
            assert "jupyter_dlc.node.standby" in env["program"], env["program"]


def test_kill_9_of_a_rank_resumes_automatically_bitwise_equal(rig, trained):
    client, job = rig.client, trained["faulty"]
    wait_for(lambda: any(c["step"] == 10 for c in client.checkpoints(job["id"])) and
             client.job(job["id"])["last_step"] == 12, 180, what="step 10 committed, held at step 12")
    # Live: metrics and rank logs come through the launcher's routes while the job runs.
    # RUNNING is the supervisor's verdict on its own tick, the steps come through the ingest:
    # two paths, so the state is waited for (a whole-suite run once read STARTING here).
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", 30, what="the job RUNNING")
    wait_for(lambda: {(p["rank"], p["step"]) for p in client.metrics_after(job["id"]) if p["name"] == "loss"} >= {
        (rank, step) for rank in range(4) for step in range(1, 13)}, 60, what="every rank's loss of steps 1-12")
    assert any(line["text"].startswith("ENV ") for line in client.logs(job["id"], rank=3)["lines"])
    victim = next(r for r in client.job(job["id"])["ranks"] if r["rank"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    open(os.path.join(trained["cwd"], "go"), "w").close()
    final = client.wait(job["id"], timeout=240)
    assert final["state"] == "SUCCEEDED", final["reason"]
    assert [a["outcome"] for a in final["attempts"]] == ["failed", "succeeded"]
    assert final["attempts"][1]["resume_path"] == os.path.join(final["attempts"][0]["checkpoint_dir"], "step-10")
    # On a warm configuration the first attempt ran on the pool, and so did the restart,
    # unless the engine warms standby agents for restarts (they win: pools.submit).
    first, second = (a["start"] for a in final["attempts"])
    assert first.startswith("warm pool ") == rig.config.pool, first
    if rig.config.pool and not rig.capabilities().standby_agents:
        assert second.startswith("warm pool "), second
    assert_equal_params(final_params(rig, final), trained["params"])
    nothing_left(rig, final)


def test_live_metrics_and_per_rank_logs_through_the_launchers_routes(rig, trained):
    job = trained["job"]
    points = list(rig.client.metrics_after(job["id"]))
    losses = {(p["rank"], p["step"]) for p in points if p["name"] == "loss"}
    assert losses >= {(rank, step) for rank in range(4) for step in range(1, STEPS_TOTAL + 1)}
    assert job["last_step"] == STEPS_TOTAL
    for rank in range(4):
        lines = [line["text"] for line in rig.client.logs(job["id"], rank=rank)["lines"]]
        [env_line] = [t for t in lines if t.startswith("ENV ")]
        assert json.loads(env_line[4:])["RANK"] == str(rank)


def test_the_checkpoint_list_is_the_engines_directory(rig, trained):
    job = trained["job"]
    listed = rig.client.checkpoints(job["id"])
    directory = job["attempts"][0]["checkpoint_dir"]
    assert [(c["step"], c["path"]) for c in listed] == [
        (step, os.path.join(directory, f"step-{step}")) for step in (10, 20, 30)]


def test_export_carries_the_documented_environment(rig, trained, tmp_path):
    """run.sh, job.sbatch and the Kubernetes workload each set the contract's variables,
    DLC_JOB_ID the job's id, and never the launcher's token."""
    import re

    import yaml

    from jupyter_dlc.export import export_job

    job = trained["job"]
    bundle = tmp_path / "bundle"
    names = {os.path.relpath(p, bundle) for p in export_job(rig.client, job["id"], str(bundle))}
    for name in ("run.sh", "job.sbatch"):
        text = (bundle / name).read_text()
        assert re.search(rf"\bDLC_JOB_ID='?{re.escape(job['id'])}'?[;\s]", text), name
        for key in ("DLC_JOB_NAME", "DLC_NNODES", "DLC_PARAMS", "DLC_BRANCH_FROM", "USER_VAR"):
            assert re.search(rf"\b{key}=", text), (name, key)
        assert rig.client.token not in text, name
    [workload] = [doc for n in sorted(names) if n.startswith("k8s/")
                  for doc in [yaml.safe_load((bundle / n).read_text())]
                  if doc["kind"] in ("TrainJob", "PyTorchJob", "Job")]
    text = json.dumps(workload)
    values = {e["name"]: e.get("value") for e in _env_lists(workload) for e in e}
    assert values["DLC_JOB_ID"] == job["id"] and values["USER_VAR"] == "x"
    assert {"DLC_JOB_NAME", "DLC_NNODES", "DLC_PARAMS", "DLC_CHECKPOINT_DIR"} <= set(values)
    assert rig.client.token not in text


def _env_lists(node):
    """Every container `env` list in a manifest."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                yield value
            else:
                yield from _env_lists(value)
    elif isinstance(node, list):
        for item in node:
            yield from _env_lists(item)


def test_resume_from_a_picked_step_that_is_not_the_newest(rig, trained):
    job = trained["job"]
    rig.client.resume(job["id"], step=10)
    wait_for(lambda: len(rig.client.job(job["id"])["attempts"]) == 2, 60, what="attempt 2")
    final = rig.client.wait(job["id"], timeout=240)
    assert final["state"] == "SUCCEEDED", final["reason"]
    second = final["attempts"][1]
    assert second["resume_path"] == os.path.join(final["attempts"][0]["checkpoint_dir"], "step-10")
    assert second["checkpoint_dir"] == final["attempts"][0]["checkpoint_dir"]
    # Steps 11-30 again from step 10's state: the clean run's parameters, bit for bit.
    assert_equal_params(final_params(rig, final), trained["params"])


def test_stop_with_grace(rig):
    polite, stubborn = stop_polite_and_stubborn(rig.launcher, rig.launcher.script("sleeper.py", SLEEPER),
                                                rig.profile, rig.cluster.grace_by_engine)
    nothing_left(rig, polite, stubborn)


def test_why_points_at_the_users_file(rig):
    script = rig.launcher.script("fails.py", FAILS)
    job = rig.client.submit(rig.spec(script=script, nodes=2, nproc_per_node=2, max_restarts=0))
    final = rig.client.wait(job["id"], timeout=180)
    assert final["state"] == "FAILED" and final["reason"].startswith("rank 3 "), final["reason"]
    [why] = rig.client.diagnosis(job["id"])
    assert why["rank"] == 3 and "ValueError: shard 7 is corrupt" in why["line"], why
    assert why["where"] == f"{script}:7", why
    nothing_left(rig, final)


def test_launcher_kill_9_mid_job_then_readoption(rig):
    script = rig.launcher.script("steps.py", STEPS)
    # The pool's shape: on a warm configuration the job runs on the pool's agents.
    job = rig.client.submit(rig.spec(script=script, nodes=2, nproc_per_node=2, heartbeat_interval=1))
    wait_for(lambda: (rig.client.job(job["id"])["last_step"] or 0) >= 5, 120, what="step 5")
    assert ran_warm(rig, job["id"]) == rig.config.pool
    engine_id = rig.client.job(job["id"])["attempts"][0].get("engine_id")
    rig.launcher.restart(kill=True)
    final = rig.client.wait(job["id"], timeout=120)
    assert final["state"] == "SUCCEEDED", final["reason"]
    assert final["attempt"] == 1 and final["last_step"] == 20
    assert final["attempts"][0].get("engine_id") == engine_id  # the same engine job, followed
    nothing_left(rig, final)


def test_a_submit_the_engine_refuses_ends_failed_in_its_words(rig):
    script = rig.launcher.script("steps.py", STEPS)
    if not rig.capabilities().submit_refusals:
        # The local engine has nobody to refuse a submit: what it cannot run is refused by
        # the launcher at once (400), and no job is stored.
        before = [j["id"] for j in rig.client.jobs()]
        with pytest.raises(LauncherError) as error:
            rig.client.submit(rig.spec(script=script, nodes=2, resources={"cpus": 4096}))
        assert error.value.status == 400 and "resources.cpus: 4096 CPUs per node" in str(error.value)
        assert [j["id"] for j in rig.client.jobs()] == before
        return
    job = rig.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                             "cluster": rig.refused_profile()})
    final = rig.client.wait(job["id"], timeout=60)
    assert final["state"] == "FAILED" and final["attempt"] == 1  # not retried: it would be again
    assert rig.cluster.refused_words in final["reason"], final["reason"]
    events = rig.client.events(job["id"])
    assert events[-1]["t"] - events[0]["t"] < 10, events
    nothing_left(rig, final)


def test_delete(rig, trained):
    job = trained["job"]
    rig.client.delete(job["id"])
    with pytest.raises(LauncherError) as error:
        rig.client.job(job["id"])
    assert error.value.status == 404
    wait_for(lambda: not os.path.exists(job["job_dir"]), 30, what="the job directory removed")
