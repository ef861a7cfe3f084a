"""The Kubernetes engine through the official `kubernetes` client (kubeconfig) against the API
stand-in in tests/k8s_standin.py, started on loopback: a stand-in, because no API server can
run on these machines. It keeps the API's semantics (201/409/404, resourceVersion, label
selectors, pod logs) and plays the operator and kubelet (pods with the operator's names and
env, phases, exit codes, OOMKilled, Unschedulable, eviction, preemption). What a real cluster
would add: real scheduling and containers (torchrun really running in the image), admission
webhooks (Kueue, Volcano, the operators' defaulting), CEL validation, garbage collection by
owner references and the kubelet's real grace period; scripts/k8s-smoke.sh covers those."""

from __future__ import annotations

import os

import pytest
from k8s_standin import Standin

from jupyter_dlc import clusters, layout
from jupyter_dlc.engines import contract
from jupyter_dlc.engines.contract import AttemptContext
from jupyter_dlc.engines.kubernetes import KubernetesEngine
from jupyter_dlc.spec import JobSpec

pytest.importorskip("kubernetes")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A stand-in serving Kubeflow Trainer and the Training Operator, and a profile for it."""
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    with Standin(groups=("trainer.kubeflow.org", "kubeflow.org")) as standin:
        standin.profile = lambda **options: clusters.put_profile("my-k8s", dict(
            {"engine": "kubernetes", "namespace": "ml", "kubeconfig": standin.kubeconfig(
                str(tmp_path / "kubeconfig")), "launcher_url": "http://launcher:8787"}, **options))
        standin.profile()
        yield standin


def _engine(poll_interval: float = 0.0) -> KubernetesEngine:
    """An engine that asks the API at every describe (these tests move the stand-in by hand)."""
    engine = KubernetesEngine()
    engine.poll_interval = poll_interval
    return engine


def _ctx(tmp_path, nodes=2, attempt=1) -> AttemptContext:
    spec = JobSpec(name="t", code="x", nodes=nodes, nproc_per_node=2, cluster="my-k8s",
                   engine="kubernetes", resources={"memory": "8G"})
    spec.validate()
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    (job_dir / "script.py").write_text("print('hi')\n")
    return AttemptContext("J7", attempt, spec, str(job_dir), str(job_dir / f"attempt-{attempt}"),
                          str(job_dir / "script.py"), {"DLC_TOKEN": "tok-123", "DLC_JOB_ID": "J7"}, 0)


def _submitted(engine, ctx):
    """The engine's submit of the attempt, from its own dry run (as the supervisor does)."""
    return engine.submit(ctx, engine.dry_run(ctx))


@pytest.mark.parametrize(("groups", "kind", "pods"), [
    (("trainer.kubeflow.org", "kubeflow.org"), "TrainJob", ["dlc-j7-a1-node-0-0-", "dlc-j7-a1-node-0-1-"]),
    (("kubeflow.org",), "PyTorchJob", ["dlc-j7-a1-master-0", "dlc-j7-a1-worker-0"]),
    ((), "Job", ["dlc-j7-a1-0-", "dlc-j7-a1-1-"]),
])
def test_submit_creates_what_the_cluster_serves_and_runs_to_success(cluster, tmp_path, groups, kind, pods):
    cluster.groups = set(groups) | {"batch"}
    engine, ctx = _engine(), _ctx(tmp_path)
    handle = engine.submit(ctx, engine.dry_run(ctx))
    assert handle["kind"] == kind and handle["engine_id"] == f"{kind}/dlc-j7-a1"
    secret = cluster.objects[("secrets", "ml", "dlc-j7-a1-token")]
    assert secret["stringData"] == {"token": "tok-123"}
    assert "tok-123" not in repr(cluster.objects[("configmaps", "ml", "dlc-j7-a1-files")])
    names = [p["metadata"]["name"] for p in cluster.pods("dlc-j7-a1")]
    assert [n[:len(prefix)] for n, prefix in zip(names, pods, strict=True)] == pods
    # Submitting the same attempt again (a launcher killed mid-submit) meets 409s and goes on.
    assert engine.submit(ctx, engine.dry_run(ctx))["name"] == "dlc-j7-a1"

    status = engine.describe(ctx, handle)
    assert status.phase == "PENDING" and status.alive and "2 of 2 pod(s) pending" in status.reason
    assert engine.logs(ctx, handle, rank=3) == ([], 0)  # nothing runs, nothing logged

    cluster.run("dlc-j7-a1")
    status = engine.describe(ctx, handle)
    assert status.phase == "RUNNING" and status.reason is None
    assert sorted(status.ranks) == [0, 1, 2, 3] and all(r.pid and r.running for r in status.ranks.values())
    # Each describe copies the pods' new lines into the attempt directory, split by rank
    # (torchrun's prefix): the contract's logs() reads that copy, as the launcher's views do.
    lines, offset = engine.logs(ctx, handle, rank=3)
    assert lines == ["node 1 line 1"] and offset > 0
    assert engine.logs(ctx, handle, rank=3, offset=offset) == ([], offset)
    assert engine.logs(ctx, handle, rank=0)[0] == ["node 0 line 0"]
    with open(layout.rank_log(ctx.attempt_dir, 2)) as f:
        assert f.read() == "node 1 line 0\n"
    engine.describe(ctx, handle)  # a second look copies nothing twice
    assert engine.logs(ctx, handle, rank=3, offset=0)[0] == ["node 1 line 1"]

    cluster.finish("dlc-j7-a1")
    status = engine.describe(ctx, handle)
    assert status.phase == "ENDED" and not status.alive and status.reason is None
    assert [r.exit_code for r in status.ranks.values()] == [0, 0, 0, 0]


def test_oom_eviction_preemption_and_image_pull_become_the_reason(cluster, tmp_path):
    engine = _engine()
    ctx = _ctx(tmp_path)
    handle = engine.submit(ctx, engine.dry_run(ctx))
    cluster.run(handle["name"])
    cluster.oom(handle["name"], node=1)
    status = engine.describe(ctx, handle)
    assert status.reason.startswith(f"OOMKilled: node 1 (pod {handle['name']}-node-0-1-")
    assert "ran out of memory; raise resources.memory" in status.reason
    assert status.ranks[2].exit_code == 137

    ctx2 = _ctx(tmp_path, attempt=2)
    handle = engine.submit(ctx2, engine.dry_run(ctx2))
    cluster.run(handle["name"])
    cluster.evict(handle["name"], node=0)
    assert engine.describe(ctx2, handle).reason.endswith("The node was low on resource: memory.")
    assert engine.describe(ctx2, handle).reason.startswith("Evicted: node 0")

    ctx3 = _ctx(tmp_path, attempt=3)
    handle = engine.submit(ctx3, engine.dry_run(ctx3))
    cluster.run(handle["name"])
    cluster.evict(handle["name"], node=1, preempted=True)
    assert engine.describe(ctx3, handle).reason.startswith("Preempted: node 1")

    ctx4 = _ctx(tmp_path, attempt=4)
    handle = engine.submit(ctx4, engine.dry_run(ctx4))
    cluster.image_pull_backoff(handle["name"])
    status = engine.describe(ctx4, handle)
    assert status.phase == "PENDING" and status.reason.startswith("ImagePullBackOff: node 0")


def test_unschedulable_is_pending_with_the_schedulers_message_and_stop_deletes(cluster, tmp_path):
    engine, ctx = _engine(), _ctx(tmp_path)
    handle = engine.submit(ctx, engine.dry_run(ctx))
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    cluster.unschedulable(handle["name"], message)
    status = engine.describe(ctx, handle)
    assert (status.phase, status.reason) == ("PENDING", f"Unschedulable: {message}")
    engine.stop(ctx, handle, 30)
    asked = cluster.deletes[-1]
    assert (asked["name"], asked["propagationPolicy"], asked["gracePeriodSeconds"]) == (
        handle["name"], "Foreground", 30)
    status = engine.describe(ctx, handle)
    assert status.phase == "ENDED" and not status.alive and status.reason is None
    engine.cleanup(ctx, handle)
    assert ("secrets", "ml", f"{handle['name']}-token") not in cluster.objects
    assert ("configmaps", "ml", f"{handle['name']}-files") not in cluster.objects


def test_a_workload_deleted_outside_ends_the_attempt_and_a_new_engine_readopts_by_labels(cluster, tmp_path):
    engine = _engine()
    first = _submitted(engine, _ctx(tmp_path, attempt=1))
    second = _submitted(engine, _ctx(tmp_path, attempt=2))
    # A restarted launcher (a new engine, no memory) finds both attempts by their labels.
    found = _engine().workloads(_ctx(tmp_path).spec, "J7")
    assert [(h["attempt"], h["name"]) for h in found] == [(1, first["name"]), (2, second["name"])]
    adopted = _engine().adopt(_ctx(tmp_path, attempt=2))
    assert {k: adopted[k] for k in ("engine_id", "kind", "name", "namespace")} == \
        {k: second[k] for k in ("engine_id", "kind", "name", "namespace")}
    assert _engine().adopt(_ctx(tmp_path, attempt=3)) is None
    cluster._remove("trainjobs", "ml", second["name"])
    for pod in cluster.pods(second["name"]):
        cluster._remove("pods", "ml", pod["metadata"]["name"])
    status = _engine().describe(_ctx(tmp_path, attempt=2), second)
    assert status.phase == "ENDED"
    assert status.reason == f"the TrainJob {second['name']} was deleted outside the launcher"
    assert os.path.isdir(tmp_path / "job")


@pytest.fixture
def k8s_launcher(cluster, tmp_path):
    """A real launcher (its own process, real SQLite) whose cluster profile points at the
    stand-in: started after the profile exists, so it reads it."""
    from conftest import LauncherEnv

    env = LauncherEnv(str(tmp_path / "launcher"))
    yield env
    env.close()


def _workload(cluster, job_id):
    """The name of the job's TrainJob in the stand-in, once the launcher created it."""
    return next((name for (plural, _, name), obj in list(cluster.objects.items()) if plural == "trainjobs"
                 and obj["metadata"]["labels"]["dlc.jupyter.org/job-id"] == job_id.lower()), None)


def _running_job(launcher, cluster, **fields):
    """A job submitted through the launcher whose TrainJob the stand-in runs: (job, name)."""
    from conftest import wait_for

    script = launcher.script("train.py", "print('hi')\n")
    job = launcher.client.submit({"script": script, "cluster": "my-k8s", **fields})
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the TrainJob")
    cluster.run(name)
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", what="RUNNING")
    return job, name


def test_through_the_launcher_pending_running_succeeded_then_oom_fails_with_why(cluster, k8s_launcher, tmp_path):
    """Stand-in cluster, real launcher: submit -> PENDING (pods pending) -> RUNNING -> SUCCEEDED;
    a second job whose pod is OOMKilled -> FAILED with that reason, and the rank logs the
    views read come from the pod log API. A real cluster would run the ranks, which would
    also report progress and checkpoints to the launcher through DLC_LAUNCHER_URL."""
    from conftest import wait_for

    client = k8s_launcher.client
    script = k8s_launcher.script("train.py", "print('hi')\n")
    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 1, "cluster": "my-k8s"})
    wait_for(lambda: client.job(job["id"])["state"] == "PENDING", what="PENDING")
    assert client.job(job["id"])["reason"] == "waiting in kubernetes: 2 of 2 pod(s) pending; logs start when they run"
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the TrainJob")
    cluster.run(name, lines_per_pod=1)  # one process per node: one rank's line per pod
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", what="RUNNING")
    wait_for(lambda: [line["text"] for line in client.logs(job["id"], rank=1)["lines"]] == ["node 1 line 0"],
             what="rank 1's log from its pod")
    cluster.finish(name)
    wait_for(lambda: client.job(job["id"])["state"] == "SUCCEEDED", what="SUCCEEDED")
    wait_for(lambda: ("secrets", "ml", f"{name}-token") not in cluster.objects, what="cleanup")

    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 1, "cluster": "my-k8s"})
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the second TrainJob")
    cluster.run(name)
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", what="RUNNING")
    cluster.oom(name, node=1)
    wait_for(lambda: client.job(job["id"])["state"] == "FAILED", what="FAILED")
    assert client.job(job["id"])["reason"].startswith(f"OOMKilled: node 1 (pod {name}-node-0-1-")
    from jupyter_dlc import formatting

    why = formatting.diagnosis_text(client.diagnosis(job["id"]), client.job(job["id"]))  # `%dlc why`
    assert "OOMKilled: node 1" in why and "raise resources.memory" in why, why


def test_through_the_launcher_unschedulable_then_stop(cluster, k8s_launcher):
    """Stand-in cluster, real launcher: the scheduler's message is the PENDING reason; stop
    deletes the TrainJob (foreground, the job's grace). A real cluster would also send the
    ranks SIGTERM and wait out the grace before removing the pods."""
    from conftest import wait_for

    client = k8s_launcher.client
    script = k8s_launcher.script("train.py", "print('hi')\n")
    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 1, "cluster": "my-k8s",
                         "stop_grace": 20})
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the TrainJob")
    message = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu. preemption: 0/8 nodes are available"
    cluster.unschedulable(name, message)
    wait_for(lambda: client.job(job["id"])["reason"] == f"waiting in kubernetes: Unschedulable: {message}",
             what="the scheduler's message")
    assert client.job(job["id"])["state"] == "PENDING"
    client.stop(job["id"])
    wait_for(lambda: client.job(job["id"])["state"] in ("STOPPED", "CANCELLED"), what="stopped")
    asked = next(d for d in cluster.deletes if d["name"] == name)
    # A job still PENDING has trained nothing: its stop takes no grace (supervisor.request_stop).
    assert (asked["propagationPolicy"], asked["gracePeriodSeconds"]) == ("Foreground", 0)


def test_the_standin_keeps_watch_log_follow_and_gone_semantics(cluster, tmp_path):
    """The stand-in itself, through the official client's typed API: a watch from a list's
    resourceVersion sees a pod's phase change; a follow log streams until the pod ends; a
    resourceVersion older than the kept history answers 410 Gone. A real API server keeps
    history by etcd compaction (minutes), not by event count."""
    from kubernetes import client, config, watch
    from kubernetes.client.exceptions import ApiException

    configuration = client.Configuration()
    config.load_kube_config(str(tmp_path / "kubeconfig"), client_configuration=configuration)
    core = client.CoreV1Api(client.ApiClient(configuration))
    handle = _submitted(_engine(), _ctx(tmp_path))
    listed = core.list_namespaced_pod("ml", label_selector="dlc.jupyter.org/job-id=j7")
    assert len(listed.items) == 2
    cluster.run(handle["name"], lines_per_pod=2)
    seen = []
    for event in watch.Watch().stream(core.list_namespaced_pod, "ml", timeout_seconds=2,
                                      label_selector="dlc.jupyter.org/attempt=1",
                                      resource_version=listed.metadata.resource_version):
        seen.append((event["type"], event["object"].status.phase))
        if len(seen) == 2:
            break
    assert seen == [("MODIFIED", "Running"), ("MODIFIED", "Running")]
    pod = listed.items[0].metadata.name
    stream = core.read_namespaced_pod_log(pod, "ml", follow=True, _preload_content=False)
    first = stream.read(20)
    cluster.finish(handle["name"])
    rest = stream.read()
    assert (first + rest).decode() == "[default0]:node 0 line 0\n[default1]:node 0 line 1\n"
    for _ in range(250):  # push the list's version out of the kept history
        cluster.run(handle["name"])
    try:
        core.list_namespaced_pod("ml", watch=True, resource_version=listed.metadata.resource_version,
                                 _preload_content=False)
        raise AssertionError("expected 410 Gone")
    except ApiException as error:
        assert error.status == 410


def test_a_killed_launcher_whose_handle_is_lost_readopts_the_workload_by_labels(cluster, k8s_launcher):
    """Stand-in cluster, real launcher: killed with -9 while the TrainJob runs, and its store
    lost the attempt's handle (as when killed between submit and storing it). The restarted
    launcher finds the TrainJob by its job-id and attempt labels, stores the handle again, and
    follows it to SUCCEEDED. A real cluster adds nothing here but real pods."""
    import signal
    import sqlite3

    from conftest import _alive, wait_for

    from jupyter_dlc.client import LauncherClient

    client = k8s_launcher.client
    job, name = _running_job(k8s_launcher, cluster, nodes=2, nproc_per_node=1)
    pid = k8s_launcher.pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), what="the launcher gone")
    with sqlite3.connect(os.path.join(k8s_launcher.data_dir, "launcher.sqlite")) as db:
        db.execute("UPDATE attempts SET handle = NULL WHERE job_id = ?", (job["id"],))
    k8s_launcher.client = client = LauncherClient.connect()
    wait_for(lambda: client.job(job["id"])["attempts"][0]["engine_id"] == f"TrainJob/{name}",
             what="the handle found again")
    adopted = [e for e in client.events(job["id"]) if e["type"] == "adopted"]
    # The engine job's name is the attempt's (`dlc-<job>-a<N>`), which the workload also bears.
    assert adopted[0]["reason"] == f"re-adopted TrainJob/{name} ({name})"
    assert client.job(job["id"])["state"] == "RUNNING"
    cluster.finish(name)
    wait_for(lambda: client.job(job["id"])["state"] == "SUCCEEDED", what="SUCCEEDED")
    assert client.job(job["id"])["attempt"] == 1


def test_pod_logs_are_read_incrementally_not_fetched_whole_each_time(cluster, tmp_path):
    """Stand-in kubelet logs with `timestamps` and `sinceTime` as the API serves them; the
    stand-in counts the bytes it sends. A long log written a minute ago, then a line per
    describe: the long log crosses the wire once, each later read only its last second, and
    every line lands in its rank's log exactly once. A real cluster adds log rotation (lines
    rotated away between two reads are lost to both, as to `kubectl logs`)."""
    import time

    engine, ctx = _engine(), _ctx(tmp_path, nodes=1)
    handle = engine.submit(ctx, engine.dry_run(ctx))
    cluster.run(handle["name"], lines_per_pod=0)
    pod = cluster.pods(handle["name"])[0]["metadata"]["name"]
    long_log = "".join(f"[default0]:step {i} {'x' * 80}\n" for i in range(2000))
    cluster.write_log("ml", pod, long_log, at=time.time() - 60)
    engine.describe(ctx, handle)
    for i in range(20):
        cluster.write_log("ml", pod, f"[default1]:tick {i}\n")
        engine.describe(ctx, handle)
    quiet = cluster.log_bytes_served[("ml", pod)]
    for _ in range(5):  # nothing new: nothing but what the current second may still add
        engine.describe(ctx, handle)
    size = len(cluster.logs[("ml", pod)].encode())
    served = cluster.log_bytes_served[("ml", pod)]
    # The whole log once (with timestamps, ~1.3x), then the ticks of the current second each
    # time: far below the 26 whole copies a full read per describe would send.
    assert served < 2 * size, (served, size)
    assert served - quiet < 0.05 * size
    with open(layout.rank_log(ctx.attempt_dir, 0)) as f:
        assert f.read() == "".join(f"step {i} {'x' * 80}\n" for i in range(2000))
    with open(layout.rank_log(ctx.attempt_dir, 1)) as f:
        assert f.read() == "".join(f"tick {i}\n" for i in range(20))
    # A restarted launcher (a new engine) goes on from the cursor kept in the attempt dir.
    cluster.write_log("ml", pod, "[default1]:after the restart\n")
    _engine().describe(ctx, handle)
    with open(layout.rank_log(ctx.attempt_dir, 1)) as f:
        assert f.read() == "".join(f"tick {i}\n" for i in range(20)) + "after the restart\n"


def test_each_rank_gets_its_own_exit_code_from_the_record_it_reported(cluster, k8s_launcher, tmp_path):
    """Stand-in cluster, real launcher, real rank bootstraps: the stand-in runs no containers,
    so the test runs the two ranks of the pod as its container would (the bootstrap, with the
    pod's env, the token from the attempt's Secret and the script from its ConfigMap), and
    they report to the launcher. Rank 1 raises, rank 0 exits 0, and the pod ends with
    torchrun's code 1: the launcher records 0 for rank 0 and 1 for rank 1 (not the pod's 1
    for both), and `why` has rank 1's error. A real cluster adds the container itself."""
    import subprocess
    import sys

    from conftest import wait_for

    client = k8s_launcher.client
    script = k8s_launcher.script("train.py", """
        import os
        if os.environ["RANK"] == "1":
            raise RuntimeError("rank 1 lost its shard")
        """)
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "cluster": "my-k8s",
                         "max_restarts": 0})
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the TrainJob")
    cluster.run(name)
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", what="RUNNING")
    [pod] = cluster.pods(name)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    assert env["DLC_RANK_RECORDS"] == "report" and "DLC_ATTEMPT_DIR" not in env
    in_pod = tmp_path / "pod"
    in_pod.mkdir()
    (in_pod / "script.py").write_text(
        cluster.objects[("configmaps", "ml", f"{name}-files")]["data"]["script.py"])
    token = cluster.objects[("secrets", "ml", f"{name}-token")]["stringData"]["token"]
    for rank in (0, 1):
        # The launcher's URL as the pod would resolve the profile's launcher_url.
        rank_env = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2", "GROUP_RANK": "0", "DLC_TOKEN": token,
                    "DLC_LAUNCHER_URL": client.url}
        subprocess.run([sys.executable, "-m", "jupyter_dlc.runtime.bootstrap", str(in_pod / "script.py")],
                       env=rank_env, cwd=in_pod, timeout=60, check=False)
    assert sorted(os.listdir(in_pod)) == ["script.py"]  # no record files in the pod
    cluster.finish(name, codes={0: 1})
    final = client.wait(job["id"], timeout=60)
    assert final["state"] == "FAILED"
    assert final["reason"].startswith("rank 1 exited with code 1"), final["reason"]
    assert {r["rank"]: r["exit_code"] for r in final["ranks"]} == {0: 0, 1: 1}
    [diagnosis] = client.diagnosis(job["id"])
    assert diagnosis["rank"] == 1 and diagnosis["line"] == "RuntimeError: rank 1 lost its shard"


def test_jupyter_dlc_clusters_checks_a_kubernetes_profile(cluster):
    """`jupyter-dlc clusters` asks the stand-in's discovery which kinds it serves; a real
    cluster would also answer for the credentials (401/403) and the namespace."""
    rows = {row["name"]: row for row in contract.check_clusters()}
    assert rows["my-k8s"]["ok"] and rows["my-k8s"]["detail"] == "serves TrainJob, PyTorchJob, Job"
    cluster.groups = {"batch"}
    assert contract.check_clusters()[0]["detail"] == "serves Job"


def test_describe_asks_the_api_at_most_once_per_interval_and_a_stop_asks_again(cluster, tmp_path):
    engine, ctx = _engine(poll_interval=3600), _ctx(tmp_path)
    handle = engine.submit(ctx, engine.dry_run(ctx))
    first = engine.describe(ctx, handle)
    cluster.run(handle["name"])
    # The kept answer (the pods run now): the ranks' records are read again, the API is not.
    assert engine.describe(ctx, handle) == first and first.phase == "PENDING"
    engine.stop(ctx, handle, 5)
    assert engine.describe(ctx, handle).phase == "ENDED"  # asked again after the delete


def test_a_workload_that_ended_while_the_launcher_was_down_ends_at_its_first_look(cluster, k8s_launcher):
    """Stand-in cluster, real launcher: killed with -9 while the TrainJob runs; the TrainJob
    succeeds before a new launcher starts. Its first look ends the attempt as SUCCEEDED (the
    final alert evaluation of a job the new launcher never evaluated included)."""
    import signal

    from conftest import _alive, wait_for

    from jupyter_dlc.client import LauncherClient

    job, name = _running_job(k8s_launcher, cluster, nodes=2, nproc_per_node=1)
    pid = k8s_launcher.pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), what="the launcher gone")
    cluster.finish(name)
    k8s_launcher.client = client = LauncherClient.connect()
    wait_for(lambda: client.job(job["id"])["state"] == "SUCCEEDED", what="SUCCEEDED")
    assert client.job(job["id"])["attempt"] == 1


POD_RANKS = """
from jupyter_dlc import runtime
from jupyter_dlc.runtime.report import get_reporter
runtime.init()
for step in range(20):
    runtime.log(step, loss=1.0 / (step + 1))
reporter = get_reporter()
assert reporter.flush(60)
print("SENT", reporter.reports_via_node, reporter.reports_sent - reporter.reports_via_node, flush=True)
"""


def test_a_pods_command_starts_its_node_reporter_and_its_ranks_report_through_it(cluster, k8s_launcher, tmp_path):
    """Stand-in cluster, real launcher. No pod can run here, so the pod's container runs as a
    local process: the TrainJob's trainer command, args and env (what the Trainer puts in the
    pod), with the Secret's token, the operator's PET_* for one node on loopback, the launcher's
    loopback URL, and the pod's paths (/dlc, the reporter's file in /tmp) moved under tmp_path.
    1 node x 2 ranks: the shell starts the node reporter beside torchrun, both ranks' reports
    go through it, every step is stored, and the reporter leaves with torchrun. A real cluster
    adds the image (jupyter-dlc and torch in it) and the pod network."""
    import re
    import subprocess
    import sys

    from conftest import wait_for
    from labserver import free_port
    from test_ingest import assert_every_step

    from jupyter_dlc.hostprocs import job_processes

    client = k8s_launcher.client
    script = k8s_launcher.script("train.py", POD_RANKS)
    job = client.submit({"script": script, "cluster": "my-k8s", "nodes": 1, "nproc_per_node": 2})
    name = wait_for(lambda: _workload(cluster, job["id"]), what="the TrainJob")
    trainer = cluster.objects[("trainjobs", "ml", name)]["spec"]["trainer"]
    files = cluster.objects[("configmaps", "ml", f"{name}-files")]["data"]
    moved = {"/dlc": str(tmp_path / "pod" / "dlc"), "/tmp/dlc-node.reporter": str(tmp_path / "pod" / "reporter")}

    def in_pod(text: str) -> str:
        return re.sub("|".join(map(re.escape, moved)), lambda m: moved[m.group(0)], text)

    os.makedirs(moved["/dlc"] + "/job")
    for file, text in files.items():
        with open(f"{moved['/dlc']}/job/{file}", "w") as f:
            f.write(text)
    secret = cluster.objects[("secrets", "ml", f"{name}-token")]["stringData"]["token"]
    env = {e["name"]: in_pod(e["value"]) if "value" in e else secret for e in trainer["env"]}
    assert env["DLC_TOKEN"] == secret  # the one variable from a Secret
    bin_dir = tmp_path / "bin"  # the image's `python`
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env.update(DLC_LAUNCHER_URL=client.url, PET_NNODES="1", PET_NODE_RANK="0",
               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(free_port()),
               PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(tmp_path))
    command = [in_pod(word) for word in trainer["command"] + trainer["args"]]
    assert "-m jupyter_dlc.node.reporter &" in command[2]
    cluster.run(name, lines_per_pod=0)
    with open(tmp_path / "pod.log", "w") as out:
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=240).returncode
    log = (tmp_path / "pod.log").read_text()
    assert code == 0, log
    sent = [line.split("SENT ")[1].split() for line in log.splitlines() if "SENT " in line]
    assert len(sent) == 2 and all(int(via) > 0 for via, _ in sent), log  # through the reporter
    assert_every_step(client, job["id"], 2, 20)
    # Its parent (torchrun, the container's PID 1) gone, the reporter leaves.
    wait_for(lambda: not any(key[0] == job["id"] for key in job_processes()), 30,
             what="the node reporter gone")
    cluster.finish(name)
    wait_for(lambda: client.job(job["id"])["state"] == "SUCCEEDED", what="SUCCEEDED")


def test_a_second_submit_of_an_attempt_makes_no_second_workload_and_hands_the_new_token(cluster, tmp_path):
    """A launcher killed mid-submit tries again with a fresh token: the workload's name is
    fixed per attempt, so the API refuses a second one (409) and adoption finds the one; the
    token Secret of the first try is replaced, or the pods' reports would be refused."""
    engine, ctx = _engine(), _ctx(tmp_path)
    engine.submit(ctx, engine.dry_run(ctx))
    ctx.env["DLC_TOKEN"] = "tok-456"
    handle = engine.submit(ctx, engine.dry_run(ctx))
    assert [w["engine_id"] for w in engine.workloads(ctx.spec, ctx.job_id)] == [handle["engine_id"]]
    assert engine.adopt(ctx)["engine_id"] == handle["engine_id"]
    assert cluster.objects[("secrets", "ml", "dlc-j7-a1-token")]["stringData"] == {"token": "tok-456"}


def test_an_api_server_that_does_not_answer_is_a_transient_refusal(cluster, tmp_path):
    from jupyter_dlc.engines.contract import SubmitError

    clusters.put_profile("my-k8s", {"engine": "kubernetes", "namespace": "ml", "launcher_url": "http://launcher:8787",
                                    "kubeconfig": _dead_kubeconfig(cluster, tmp_path)})
    engine, ctx = _engine(), _ctx(tmp_path)
    engine.kind_for = lambda spec: "Job"  # type: ignore[method-assign]  # no discovery: nothing answers
    with pytest.raises(SubmitError) as refused:
        engine.submit(ctx, engine.dry_run(ctx))
    assert not refused.value.permanent and "unreachable" in refused.value.message


def _dead_kubeconfig(cluster, tmp_path) -> str:
    import socket

    import yaml

    path = cluster.kubeconfig(str(tmp_path / "dead-kubeconfig"))
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(path) as f:
        config = yaml.safe_load(f)
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path
