"""The Slurm engine on a real Slurm cluster: `scripts/local-slurm.sh` starts slurmctld and 4
slurmd (nodes n1..n4 with addresses 127.0.0.11..14) on this machine, and the module's
launcher submits with real sbatch, watches with real squeue, stops with real scancel.

The emulated nodes share this machine's process table and filesystem: "no process on any
node" is checked both in Slurm (squeue) and in /proc, which is every node's here.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import (
    LauncherEnv,
    assert_launcher_env,
    wait_for,
)
from test_ingest import THROUGH_NODE_REPORTERS, check_node_reporters
from test_jobs import ENV_SCRIPT, SLEEPER, rank_env
from test_notebook import run_notebook, text
from test_recovery import TRAIN
from test_warm_ranks import check_forked_start

from jupyter_dlc import formatting
from jupyter_dlc.hostprocs import job_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "local-slurm.sh")
CLUSTER = "local-slurm"


@contextlib.contextmanager
def local_slurm(root: pathlib.Path, port: str, private_dir: str = "", **more: str):
    """A private local Slurm cluster (own state dir, own ports, own profile file), up while
    the block runs and down after it: nothing is left. Yields the Slurm clients' env.
    `private_dir` ("n2:/path"): a directory that node does not share with the others ("all:/path":
    every node has its own); `more`: local-slurm.sh's other settings (DLC_SLURM_SHARED...)."""
    env = dict(os.environ, DLC_SLURM_DIR=str(root / "cluster"), DLC_SLURM_PORT=port,
               DLC_CLUSTERS=str(root / "dlc_clusters.yaml"), PYTHON=sys.executable,
               DLC_SLURM_PRIVATE_DIR=private_dir, **more)
    up = subprocess.run([SCRIPT, "up"], env=env, capture_output=True, text=True, timeout=600,
                        check=False)
    if up.returncode == 3:
        pytest.skip(f"Slurm cannot be installed here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, up.stdout + up.stderr
    saved = os.environ.get("DLC_CLUSTERS")
    os.environ["DLC_CLUSTERS"] = env["DLC_CLUSTERS"]
    try:
        yield dict(env, SLURM_CONF=str(root / "cluster" / "slurm.conf"))
    finally:
        down = subprocess.run([SCRIPT, "down"], env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        if saved is None:
            os.environ.pop("DLC_CLUSTERS", None)
        else:
            os.environ["DLC_CLUSTERS"] = saved
    assert down.returncode == 0, down.stderr
    assert not os.path.exists(env["DLC_SLURM_DIR"])


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm"), "16917") as client_env:
        yield client_env


@pytest.fixture
def launcher(slurm, tmp_path):
    env = LauncherEnv(str(tmp_path))  # started after DLC_CLUSTERS is set: it sees the profile
    yield env
    env.close()


def squeue_ids(slurm) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm, capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def engine_id(client, job_id, attempt=-1) -> str | None:
    return client.job(job_id)["attempts"][attempt].get("engine_id")


def test_ranks_report_through_node_reporters_and_directly_once_theirs_is_gone(launcher, slurm, tmp_path):
    """2 Slurm nodes x 2 ranks: each node's task starts a node reporter beside its torchrun
    agent, the ranks' reports arrive as node batches; node 1's reporter is killed mid-job and
    its ranks report directly, losing nothing; the reporters leave with their steps."""
    script = launcher.script("through.py", THROUGH_NODE_REPORTERS)
    job = check_node_reporters(launcher.client, {"script": script, "cluster": CLUSTER}, tmp_path / "go")
    with open(os.path.join(job["job_dir"], "attempt-1", "job.sbatch")) as f:
        assert "-m jupyter_dlc.node.reporter &" in f.read()
    assert engine_id(launcher.client, job["id"]) not in squeue_ids(slurm)
    wait_for(lambda: not [p for (j, _), pids in job_processes().items() if j == job["id"] for p in pids],
             30, what="no process of the job left")


def test_a_slurm_nodes_agent_forks_its_ranks_unless_told_not_to(launcher, slurm):
    """As on the local engine: each Slurm node's task runs one agent that imports torch once
    and forks its ranks (the batch script's agent line is `-m jupyter_dlc.node.standby
    --cold`), or torchrun's own fresh interpreters with DLC_FORKED_START=0; the node's exit
    record is still the task's, with the Slurm job's id."""
    check_forked_start(launcher, {"cluster": CLUSTER})
    for job in (launcher.client.job(j["id"]) for j in launcher.client.jobs()):
        with open(os.path.join(job["job_dir"], "attempt-1", "node-0.exit")) as f:
            code, slurm_job = f.read().split()
        assert code == "0" and slurm_job == engine_id(launcher.client, job["id"])


def test_scancel_from_outside_ends_the_job_with_that_reason(launcher, slurm):
    script = launcher.script("sleeper.py", SLEEPER)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "cluster": CLUSTER, "max_restarts": 3})
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", 120, what="RUNNING")
    slurm_id = engine_id(launcher.client, job["id"])
    subprocess.run(["scancel", slurm_id], env=slurm, check=True)
    final = launcher.client.wait(job["id"], timeout=60)
    assert final["state"] == "FAILED"
    assert final["reason"] == f"Slurm job {slurm_id} was cancelled outside the launcher (scancel)"
    assert final["attempt"] == 1  # an operator's cancel is not a failure to retry
    wait_for(lambda: slurm_id not in squeue_ids(slurm), 30, what="Slurm let the job go")
    wait_for(lambda: not job_processes().get((job["id"], 1)), 30, what="no process left")


def test_job_bigger_than_the_free_nodes_pends_with_slurms_reason_and_stops(launcher, slurm):
    # Hold three of the four nodes with a job of our own, so that a 2-node job must wait.
    blocker = subprocess.run(["sbatch", "--parsable", "-N3", "--exclusive", "--output=/dev/null",
                              "--wrap", "sleep 600"],
                             env=slurm, capture_output=True, text=True, check=True).stdout.strip()
    try:
        script = launcher.script("sleeper.py", SLEEPER)
        job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                      "cluster": CLUSTER})
        # Slurm says Priority or None for a moment, then Resources once it has tried.
        def pending_for_resources():
            now = launcher.client.job(job["id"])
            return now["state"] == "PENDING" and now["reason"] == "waiting in slurm: Resources"

        wait_for(pending_for_resources, 60, what="PENDING for Resources")
        slurm_id = engine_id(launcher.client, job["id"])
        shown = formatting.status_text(launcher.client.job(job["id"]))
        assert "reason: waiting in slurm: Resources" in shown
        assert f"engine: slurm job {slurm_id} on cluster local-slurm" in shown
        assert slurm_id in squeue_ids(slurm)
        launcher.client.stop(job["id"], grace=5)
        stopped = launcher.client.wait(job["id"], timeout=60)
        assert stopped["state"] == "STOPPED"
        wait_for(lambda: slurm_id not in squeue_ids(slurm), 30, what="pending job cancelled")
    finally:
        subprocess.run(["scancel", blocker], env=slurm, check=False)
    wait_for(lambda: blocker not in squeue_ids(slurm), 30, what="blocker gone")


def test_too_big_for_the_partition_is_refused_at_submit(launcher):
    script = launcher.script("sleeper.py", SLEEPER)
    for spec, message in (
            ({"nodes": 5}, ("nodes: 5 nodes but partition debug of cluster local-slurm has 4; "
                            "use --nodes 4 or fewer")),
            ({"resources": {"gpus": 1}}, ("resources.gpus: 1 per node but the largest node of "
                                          "cluster local-slurm has 0; use --gpus-per-node 0 or less")),
            ({"resources": {"memory": "4G"}}, ("resources.memory: 4096M per node but the largest "
                                               "node of cluster local-slurm has 2000M")),
            ({"cluster": "nope"}, "cluster: no profile named 'nope' (profiles: local-slurm)")):
        with pytest.raises(Exception) as error:
            launcher.client.submit(dict({"script": script, "cluster": CLUSTER}, **spec))
        assert message in str(error.value)


def test_dry_run_prints_the_batch_script_sbatch_would_get_and_queues_nothing(launcher, slurm, capsys):
    """`--dry-run` on the Slurm engine: the capacity check ran (sinfo; a 5-node job is refused
    as a submit is) and the answer is the batch script and the sbatch line, queued nowhere."""
    from jupyter_dlc import cli

    script = launcher.script("sleeper.py", SLEEPER)
    assert cli.main(["run", script, "--cluster", CLUSTER, "--nodes", "2", "--nproc-per-node", "2",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "what the slurm engine would be asked" in out and "# cluster profile: local-slurm" in out
    [sbatch] = [line for line in out.splitlines() if line.startswith("sbatch ")]
    assert sbatch.startswith("sbatch --parsable --export=ALL /") and sbatch.endswith("/job.sbatch"), sbatch
    batch = out.split("# job.sbatch:\n", 1)[1]
    assert batch.startswith("#!/bin/bash\n#SBATCH --job-name=dlc-sleeper-") and "#SBATCH --nodes=2\n" in batch
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in batch
    assert "DLC_LAUNCHER_PROOF='<proof key: made at submit>'" in batch
    assert squeue_ids(slurm) == [] and launcher.client.jobs() == []
    assert cli.main(["run", script, "--cluster", CLUSTER, "--nodes", "5", "--dry-run"]) == 2
    assert "nodes: 5 nodes but partition debug" in capsys.readouterr().err


def test_a_node_that_cannot_reach_the_launcher_fails_preflight_once(launcher, slurm, tmp_path):
    """Node n2 runs its Python in a network namespace of its own: its preflight verdict cannot
    reach the launcher, so no event will say why it failed. The batch script exits with the
    preflight's own code, Slurm keeps it, and the attempt ends FAILED once with that reason,
    not restarted into the same wall (its ranks could not have reported either)."""
    from jupyter_dlc import clusters

    wrapper = tmp_path / "python-no-network-on-n2"
    wrapper.write_text(f"""#!/bin/sh
if [ "$SLURMD_NODENAME" = n2 ]; then exec unshare -n {sys.executable} "$@"; fi
exec {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    clusters.put_profile("cutoff", dict(clusters.get_profile(CLUSTER).options, engine="slurm",
                                        python=str(wrapper)))
    ran = tmp_path / "ran"
    try:
        job = launcher.client.submit({"script": launcher.script("never.py", f"open({str(ran)!r}, 'a').close()\n"),
                                      "nodes": 2, "nproc_per_node": 1, "cluster": "cutoff",
                                      "max_restarts": 2})
        final = launcher.client.wait(job["id"], timeout=180)
    finally:
        clusters.remove_profile("cutoff")
    assert final["state"] == "FAILED" and final["attempt"] == 1, final["reason"]
    url = launcher.client.url.rstrip("/")
    assert final["reason"].startswith(f"preflight on a node of Slurm job {engine_id(launcher.client, job['id'])}: "
                                      f"it cannot reach the launcher at {url}"), final["reason"]
    assert not ran.exists()


def test_dlc_cell_on_the_local_slurm_cluster(launcher, tmp_path):
    nb = run_notebook([
        "%load_ext jupyter_dlc",
        ("%%dlc --cluster local-slurm --nodes 2 --nproc-per-node 2 --name nbslurm --wait\n"
         "import os, torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo')\n"
         "t = torch.ones(1) * dist.get_rank()\n"
         "dist.all_reduce(t)\n"
         "print('SUM', t.item(), 'SLURM', os.environ['SLURM_JOB_ID'])\n"),
        "%dlc status last",
    ], str(tmp_path))
    status = text(nb.cells[2])
    assert "SUCCEEDED" in status, text(nb.cells[1]) + status
    assert "engine: slurm job " in status
    # The live view (widget state saved by nbclient) names the engine and its job id too.
    assert "engine: slurm job " in json.dumps(nb.metadata.get("widgets", {}))
    job = launcher.client.job("last")
    assert job["spec"]["cluster"] == CLUSTER and job["spec"]["engine"] == "slurm"
    lines = [line["text"] for line in launcher.client.logs(job["id"])["lines"]]
    assert sum(1 for t in lines if t.startswith("SUM 6.0 SLURM ")) == 4


def test_clusters_command_checks_each_profile_live(slurm, launcher):
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "clusters"], env=dict(
        os.environ, DLC_CLUSTERS=slurm["DLC_CLUSTERS"]), capture_output=True, text=True, timeout=60,
        check=False)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(CLUSTER))
    assert row.split()[:5] == [CLUSTER, "slurm", "yes", "4", "0"]
    broken = json.dumps({"clusters": {"gone": {"engine": "slurm",
                                               "env": {"SLURM_CONF": "/nonexistent/slurm.conf"}}}})
    path = os.path.join(launcher.root, "broken.yaml")
    with open(path, "w") as f:
        f.write(broken)
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "clusters"],
                         env=dict(os.environ, DLC_CLUSTERS=path), capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 1 and "gone" in out.stdout and " NO " in out.stdout


def test_export_writes_a_job_sbatch_that_plain_sbatch_runs(launcher, slurm, tmp_path):
    """A job the local engine ran, exported, then submitted by hand with plain sbatch."""
    from jupyter_dlc.export import export_job

    # The bundle runs plain torchrun, without our bootstrap: the script itself leaves as
    # FIELD-NOTES says a multi-node gloo script must, or a rank may crash at interpreter exit.
    script = launcher.script("envjob.py", ENV_SCRIPT + "dist.destroy_process_group()\nos._exit(0)\n")
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2,
                                  "name": "exported", "env": {"USER_VAR": "y"}})
    assert launcher.client.wait(job["id"], timeout=180)["state"] == "SUCCEEDED"
    bundle = tmp_path / "bundle"
    export_job(launcher.client, job["id"], str(bundle))
    batch = (bundle / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in batch and "jupyter_dlc" not in batch
    submitted = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=bundle, check=True,
                               env=dict(slurm, PYTHON=sys.executable), capture_output=True,
                               text=True).stdout.strip()
    wait_for(lambda: submitted not in squeue_ids(slurm), 180, what="the exported job to end")
    envs = {}
    for node in (0, 1):
        for line in (bundle / "logs" / f"node-{node}.log").read_text().splitlines():
            if "ENV {" in line:
                env = json.loads(line[line.index("ENV {") + 4:])
                envs[int(env["RANK"])] = env
    assert sorted(envs) == [0, 1, 2, 3], (bundle / "logs" / "node-0.log").read_text()[-2000:]
    for env in envs.values():
        assert env["sum"] == 6.0 and env["USER_VAR"] == "y"
        assert env["DLC_JOB_DIR"] == str(bundle) and env["MASTER_ADDR"].startswith("127.0.0.1")
        assert env["DLC_TOKEN"] is None and env["DLC_LAUNCHER_URL"] is None
    assert [(bundle / "logs" / f"node-{n}.exit").read_text().strip() for n in (0, 1)] == ["0", "0"]


def test_the_slurm_example_notebook_runs(launcher, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(ROOT, "examples", "slurm.ipynb"), as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {i: text(cell) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"}
    joined = "\n".join(outputs.values())
    assert "local-slurm" in joined and "SUCCEEDED" in joined, joined[-3000:]
    assert "engine: slurm job " in joined and "step-60" in joined
    assert "#SBATCH --nodes=2" in joined
    job = launcher.client.job("last")
    assert job["name"] == "slurm-demo" and job["spec"]["engine"] == "slurm"


def test_local_slurm_script_is_idempotent_and_reports_status(slurm):
    env = dict(slurm, PYTHON=sys.executable)
    state = pathlib.Path(env["DLC_SLURM_DIR"])

    def daemon_pids():
        return sorted(path.read_text() for path in state.glob("*.pid"))

    pids = daemon_pids()
    assert len(pids) == 6
    again = subprocess.run([SCRIPT, "up"], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert daemon_pids() == pids  # nothing restarted, nothing doubled
    status = subprocess.run([SCRIPT, "status"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert status.returncode == 0
    assert status.stdout.count(": running (pid") == 6  # munged, slurmctld, 4 slurmd
    assert all(f"n{k} " in status.stdout for k in range(1, 5))


def test_stop_checkpoints_and_resume_is_a_new_slurm_job_from_that_step(launcher):
    """Stop is SIGTERM through Slurm: the runtime checkpoints at the next step boundary (the
    node's task shell must not end the step under it); resume submits a new sbatch."""
    script = launcher.script("train.py", TRAIN)
    client = launcher.client
    job = client.submit({"script": script, "args": ["400", "0.05"], "nodes": 2, "nproc_per_node": 1,
                         "heartbeat_interval": 1, "cluster": CLUSTER})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 13, 180, what="step 13")
    first = engine_id(client, job["id"])
    client.stop(job["id"], grace=30)
    stopped = client.wait(job["id"], timeout=90)
    assert stopped["state"] == "STOPPED" and "checkpoint committed" in stopped["reason"]
    last = stopped["last_step"]
    assert [c["step"] for c in client.checkpoints(job["id"])][-1] == last
    client.resume(job["id"])
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", 180, what="resumed attempt")
    attempt = client.job(job["id"])["attempts"][-1]
    assert attempt["resume_path"].endswith(f"step-{last}") and attempt["engine_id"] != first
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) > last, 120, what="progress after resume")
    client.stop(job["id"], grace=5)
    assert client.wait(job["id"], timeout=90)["state"] == "STOPPED"


def test_a_warm_pool_is_a_held_allocation_and_its_jobs_skip_the_queue(launcher, slurm, tmp_path):
    """`pool up --cluster local-slurm`: one sbatch holds 2 nodes with an agent each; a job of
    that shape runs inside the allocation (no Slurm job of its own), with the env contract."""
    client = launcher.client
    client.pool_up(2, 2, cluster=CLUSTER)
    wait_for(lambda: [p for p in client.pools() if p["state"] == "ready"], 180, what="pool ready")
    pool = client.pools()[0]
    allocation = pool["engine_id"]
    assert pool["id"] == f"{CLUSTER}-2x2" and pool["engine"] == "slurm"
    assert squeue_ids(slurm) == [allocation]
    script = launcher.script("envjob.py", ENV_SCRIPT.replace(
        '"argv":', '"SLURM_JOB_ID": os.environ.get("SLURM_JOB_ID"), "argv":'))
    job = client.submit({
        "script": script, "args": ["--lr", "0.1"], "nodes": 2, "nproc_per_node": 2,
        "name": "envjob", "cluster": CLUSTER, "network": "tcp", "workdir": str(tmp_path),
        "env": {"USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0"}})
    job = client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    reasons = [e["reason"] or "" for e in client.events(job["id"]) if e["type"] == "state"]
    assert any(r.endswith(f"; warm pool {CLUSTER}-2x2") for r in reasons), reasons
    assert not job["attempts"][0].get("engine_id")  # no Slurm job of its own: no queue
    for rank, env in rank_env(client, job["id"], 4).items():
        assert env["RANK"] == str(rank) and env["GROUP_RANK"] == str(rank // 2)
        assert env["MASTER_ADDR"] == "127.0.0.11"  # the head node's NodeAddr, as cold
        assert env["SLURM_JOB_ID"] == allocation
        assert_launcher_env(env, job, launcher, tmp_path)
    assert squeue_ids(slurm) == [allocation]
    assert client.pool_down(cluster=CLUSTER) == [f"{CLUSTER}-2x2"]
    wait_for(lambda: allocation not in squeue_ids(slurm), 60, what="allocation released")
    marker = f"DLC_POOL_DIR={launcher.data_dir}".encode()
    wait_for(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and _has(p, marker)], 60,
             what="pool agents gone")


def _has(pid: str, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(item.startswith(marker) for item in f.read().split(b"\0"))
    except OSError:
        return False
