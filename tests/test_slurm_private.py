"""The Slurm engine where the nodes do not see the launcher's filesystem (`shared_filesystem:
false`), on a real local Slurm cluster: every slurmd runs in a mount namespace of its own with
an empty tmpfs over the directory that holds this module's launchers' data directories (and
the users' scripts), so no node can read or write a job directory; the checkpoint directory
(the profile's `checkpoint_dir`) stays shared, as it must.

What the nodes run comes inside the batch script (node/slurm_node.py), their logs and
exits come back over the launcher's routes, rank records over the report route.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile

import pytest
from conftest import (
    LauncherEnv,
    assert_launcher_env,
    assert_torchrun_env,
    env_contract_spec,
    stop_polite_and_stubborn,
    wait_for,
)
from test_jobs import SLEEPER, rank_env
from test_recovery import TRAIN, committed_beyond
from test_slurm import local_slurm, squeue_ids
from test_ssh import FAILS_ON_RANK_3, SEES

from jupyter_dlc import clusters, layout

CLUSTER = "local-slurm"
PORT = "17717"  # apart from test_slurm.py's 16917, the records module's 17517


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, and the directories: `hidden` (no node sees into it: the launchers live
    there), `ckpt` (every node and the launcher see it), `work` (a shared working directory)."""
    root = tmp_path_factory.mktemp("slurm-private")
    dirs = {name: root / name for name in ("hidden", "ckpt", "work")}
    for path in dirs.values():
        path.mkdir()
    with local_slurm(root, PORT, f"all:{dirs['hidden']}", DLC_SLURM_SHARED="false",
                     DLC_SLURM_CHECKPOINT_DIR=str(dirs["ckpt"])) as env:
        yield dict(dirs, env=env)


@pytest.fixture
def launcher(cluster, request):
    root = cluster["hidden"] / request.node.name
    root.mkdir()
    env = LauncherEnv(str(root))
    yield env
    env.close()


def copies_of(job_id: str) -> list[str]:
    """The nodes' copies of a job's directory (their /tmp is this machine's here)."""
    return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"dlc-{job_id}-")]


def slurm_job(client, job_id: str, attempt: int = -1) -> str:
    return client.job(job_id)["attempts"][attempt]["engine_id"]


def test_env_contract_files_logs_and_metrics_without_the_job_directory(launcher, cluster):
    """2 nodes x 2: the ranks cannot see the launcher's data directory; the script and a
    pushed file reach them inside the batch script, into a directory of each node's own
    (removed at the end); their per-rank logs and metrics reach the launcher's routes, node
    exits come over the report route (no exit file is written, none could be read)."""
    client = launcher.client
    data = cluster["work"] / "data.txt"
    data.write_text("pushed value")
    spec = env_contract_spec(launcher.script("envjob.py", SEES), cluster["work"], cluster=CLUSTER,
                             files={"data.txt": str(data)},
                             env={"USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0",
                                  "LAUNCHER_DATA": launcher.data_dir})
    job = client.wait(client.submit(spec)["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    slurm_id = slurm_job(client, job["id"])
    envs = rank_env(client, job["id"], 4)  # from the per-rank logs, through client.logs
    for rank, env in envs.items():
        node = rank // 2
        assert_torchrun_env(env, rank)
        assert env["sees_launcher_data"] is False  # nothing of the job directory is in sight
        assert env["pushed"] == "pushed value"
        staged = env["DLC_JOB_DIR"]
        assert os.path.basename(staged).startswith(f"dlc-{job['id']}-a1-n{node}-"), staged
        assert env["attempt_dir"] == os.path.join(staged, "attempt-1")
        assert env["node_reporter"] == f"{env['attempt_dir']}/node-{node}.reporter" and env["via_node"] > 0
        assert_launcher_env(env, job, launcher, cluster["work"], job_dir=staged,
                            checkpoint_dir=str(cluster["ckpt"] / job["id"]))
        assert not os.path.exists(staged)  # each node removed its copy
    points = [p for p in client.metrics_after(job["id"]) if p["name"] == "probe"]
    assert sorted(p["rank"] for p in points) == [0, 1, 2, 3]
    attempt_dir = layout.attempt_dir(job["job_dir"], 1)
    for node in (0, 1):  # torchrun's own lines came back too
        with open(layout.node_log(attempt_dir, node)) as f:
            assert "OMP_NUM_THREADS" in f.read()
        assert not os.path.exists(layout.node_exit(attempt_dir, node))
    exits = [e["data"] for e in client.events(job["id"]) if e["type"] == layout.NODE_EXIT]
    assert sorted((e["node"], e["exit_code"], e["engine_id"]) for e in exits) == \
        [(0, 0, slurm_id), (1, 0, slurm_id)]
    with open(os.path.join(attempt_dir, "job.sbatch")) as f:
        batch = f.read()
    assert "#SBATCH --output=/dev/null" in batch and client.token not in batch
    assert slurm_id not in squeue_ids(cluster["env"])


def test_hostile_file_names_and_env_values_never_become_shell(launcher, cluster, tmp_path):
    """A pushed file's name and an --env value with a newline, `$(...)` and quotes travel as
    data (base64 in the batch script, quoted exports): the rank sees them exactly, and what
    they would have run, had they become shell, never ran."""
    mark = tmp_path / "ran"
    trick = f"a\n$(touch {mark})'\"b`touch {mark}`"
    data = tmp_path / "d.txt"
    data.write_text("exact")
    name = "we$(id)'\"ird\n.txt"
    script = launcher.script("tricky.py", """
import json, os
folder = os.path.join(os.environ["DLC_JOB_DIR"], "files")
print("SEEN " + json.dumps({"env": os.environ["TRICKY"],
                            "files": {n: open(os.path.join(folder, n)).read() for n in os.listdir(folder)}}))
""")
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 1, "cluster": CLUSTER,
                                  "env": {"TRICKY": trick}, "files": {name: str(data)}})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    [seen] = [line["text"] for line in launcher.client.logs(job["id"])["lines"] if line["text"].startswith("SEEN ")]
    assert json.loads(seen[5:]) == {"env": trick, "files": {name: "exact"}}
    assert not mark.exists()


def test_kill_9_of_a_rank_resumes_from_the_shared_checkpoint_dir(launcher, cluster):
    client = launcher.client
    job = client.submit({"script": launcher.script("train.py", TRAIN), "args": ["40", "0.1"], "nodes": 2,
                         "nproc_per_node": 2, "cluster": CLUSTER, "max_restarts": 2, "heartbeat_interval": 1})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 12 and committed_beyond(client, job["id"], 0),
             180, what="a committed checkpoint")
    first = slurm_job(client, job["id"])
    victim = next(r for r in client.job(job["id"])["ranks"] if r["rank"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    final = client.wait(job["id"], timeout=240)
    assert final["state"] == "SUCCEEDED", final["reason"]
    attempts = final["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[1]["engine_id"] != first  # a new sbatch
    mine = str(cluster["ckpt"] / job["id"])
    assert attempts[1]["resume_path"].startswith(mine + "/step-"), attempts[1]["resume_path"]
    assert {os.path.dirname(c["path"]) for c in client.checkpoints(job["id"])} == {mine}
    assert final["last_step"] == 40


def test_a_failing_rank_is_diagnosed_at_the_users_file(launcher):
    script = launcher.script("fails.py", FAILS_ON_RANK_3)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2, "cluster": CLUSTER,
                                  "max_restarts": 0})
    final = launcher.client.wait(job["id"], timeout=180)
    assert final["state"] == "FAILED"
    assert "rank 3" in final["reason"] and "exited with code 1" in final["reason"], final["reason"]
    [why] = launcher.client.diagnosis(job["id"])
    assert "ValueError: shard 7 is corrupt" in why["line"], why
    assert why["where"] == f"{script}:7", why  # the user's file, not the node's copy
    lines = [line["text"] for line in launcher.client.logs(job["id"])["lines"] if line["rank"] == 3]
    assert "rank 3 up" in lines and any("ValueError: shard 7 is corrupt" in t for t in lines), lines
    wait_for(lambda: not copies_of(job["id"]), 30, what="the nodes' copies removed")


def test_stop_with_grace_leaves_nothing_on_any_node(launcher, cluster):
    polite, stubborn = stop_polite_and_stubborn(launcher, launcher.script("sleeper.py", SLEEPER), CLUSTER)
    ids = [j["attempts"][-1]["engine_id"] for j in (polite, stubborn)]
    wait_for(lambda: not set(ids) & set(squeue_ids(cluster["env"])), 30, what="Slurm jobs gone")
    wait_for(lambda: launcher.own_processes() == [], 30, what="no process on any node")
    # The stubborn job's tasks were killed with SIGKILL: its batch shell removed their copies.
    assert copies_of(polite["id"]) == copies_of(stubborn["id"]) == []


def test_without_a_checkpoint_dir_or_with_too_much_to_carry_a_job_is_refused(launcher, cluster, tmp_path):
    script = launcher.script("sleeper.py", SLEEPER)
    clusters.put_profile("nockpt", {"engine": "slurm", "shared_filesystem": False,
                                    "env": {"SLURM_CONF": cluster["env"]["SLURM_CONF"]}})
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.write(os.urandom(5 * 2**20))  # random: gzip cannot shrink it under Slurm's 4 MiB
    try:
        with pytest.raises(Exception) as error:
            launcher.client.submit({"script": script, "cluster": "nockpt"})
        with pytest.raises(Exception) as too_big:
            launcher.client.submit({"script": script, "cluster": CLUSTER, "files": {"big.bin": str(big)}})
    finally:
        clusters.remove_profile("nockpt")
    assert str(error.value) == (
        "cluster nockpt: checkpoint_dir: the nodes do not share the launcher's job directory "
        "(shared_filesystem: false), so checkpoints need a directory every node and this machine "
        "see; set checkpoint_dir: PATH in the profile or pass --checkpoint-dir")
    assert str(too_big.value).startswith("files: the script and pushed files take "), str(too_big.value)
    assert "MiB compressed and encoded, over the 3.9 MiB a batch script of cluster local-slurm carries" \
        in str(too_big.value)
    assert launcher.client.jobs() == []


def test_nothing_of_the_job_directory_is_visible_on_a_node(cluster):
    """The premise of this module, checked on the cluster itself: a node sees an empty
    directory where the launchers' data lives."""
    (cluster["hidden"] / "probe").write_text("here")
    out = subprocess.run(["srun", "-N1", "-w", "n2", "ls", "-A", str(cluster["hidden"])], env=cluster["env"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == ""
