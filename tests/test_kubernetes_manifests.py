"""Kubernetes manifests of the engine, validated strictly against the official schemas (CRDs in
../shared/k8s, core types with kubernetes-validate). No cluster needed: these are the objects
the engine would send; a real API server would also run the CEL rules and admission webhooks
(Kueue, Volcano, the operators' defaulting), which no schema here covers."""

from __future__ import annotations

import base64
import os

import jsonschema
import pytest
from k8s_validate import require_crds, validate

from jupyter_dlc import clusters
from jupyter_dlc.engines.kubernetes import manifests as k8s_manifests
from jupyter_dlc.engines.contract import AttemptContext, get_engine
from jupyter_dlc.spec import JobSpec


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    return tmp_path


def _ctx(tmp_path, spec: JobSpec, files: dict[str, bytes] | None = None, attempt: int = 2):
    job_dir = tmp_path / "job"
    (job_dir / "files").mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        (job_dir / "files" / name).write_bytes(data)
    script = job_dir / "script.py"
    script.write_text("import torch.distributed as dist\nprint('hello')\n")
    env = {"DLC_JOB_ID": "J1a", "DLC_ATTEMPT": str(attempt), "DLC_TOKEN": "s3cret-token-value",
           "DLC_LAUNCHER_URL": "http://127.0.0.1:9", "EASYCKPT_RESUME_PATH": "/ck/step-5",
           "MASTER_ADDR": "127.0.0.1"}
    return AttemptContext(job_id="J1a", attempt=attempt, spec=spec, job_dir=str(job_dir),
                          attempt_dir=str(job_dir / f"attempt-{attempt}"), script_path=str(script),
                          env=env, port=0)


def _spec(**extra) -> JobSpec:
    spec = JobSpec(name="train", code="print(1)", nodes=3, nproc_per_node=4, cluster="my-k8s",
                   checkpoint_dir="/ck", resources={"gpus": 4, "cpus": 16, "memory": "64G"},
                   env={"MY_VAR": "x"}, **extra)
    spec.validate()
    return spec


PROFILE = {"engine": "kubernetes", "namespace": "ml", "image": "ghcr.io/me/train:1",
           "node_selector": {"gpu": "h100"},
           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
           "pvc": "team-ckpt", "launcher_url": "http://jupyter-dlc.ml:8787"}


def _manifests(tmp_path, kind, pushed=None, **options):
    clusters.put_profile("my-k8s", dict(PROFILE, kind=kind, **options))
    request = get_engine("kubernetes").dry_run(_ctx(tmp_path, _spec(), pushed))
    return {m["kind"]: m for m in request.native["manifests"]}


def _pod_parts(found: dict) -> tuple[dict, dict]:
    """(pod spec, container) of the one workload in `found`."""
    if "PyTorchJob" in found:
        pod = found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    else:
        pod = found["Job"]["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob", "Job"])
def test_every_kind_validates_strictly_and_keeps_the_token_out(profiles, tmp_path, kind):
    found = _manifests(tmp_path, kind, pushed={"weights.bin": b"\x00\x01binary"})
    for manifest in found.values():
        validate(manifest)
        assert "s3cret-token-value" not in repr(manifest)
        assert manifest["metadata"]["namespace"] == "ml"
        assert manifest["metadata"]["labels"][k8s_manifests.LABEL_JOB] == "j1a"
    cm = found["ConfigMap"]
    assert cm["data"]["script.py"].startswith("import torch")
    assert base64.b64decode(cm["binaryData"]["weights.bin"]) == b"\x00\x01binary"
    if kind == "TrainJob":
        spec = found["TrainJob"]["spec"]
        assert spec["runtimeRef"] == {"name": "torch-distributed"}
        trainer = spec["trainer"]
        assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 4
        assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
        env = {e["name"]: e for e in trainer["env"]}
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = patch["template"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"gpu": "h100"}
        assert {v["name"] for v in pod["volumes"]} == {"dshm", "ckpt", "job"}
        return
    pod, container = _pod_parts(found)
    env = {e["name"]: e for e in container["env"]}
    assert container["image"] == "ghcr.io/me/train:1"
    assert container["resources"]["limits"] == {"cpu": "16", "memory": "65536Mi", "nvidia.com/gpu": "4"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "ckpt", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in pod["volumes"]
    # The env contract: DLC_* and the resume path (on the PVC) added, the token from a Secret.
    assert env["EASYCKPT_RESUME_PATH"]["value"] == "/dlc/pvc/jobs/j1a/checkpoints/step-5"
    assert env["DLC_CHECKPOINT_DIR"]["value"] == "/dlc/pvc/jobs/j1a/checkpoints"
    assert env["DLC_LAUNCHER_URL"]["value"] == "http://jupyter-dlc.ml:8787"
    assert env["DLC_TOKEN"]["valueFrom"]["secretKeyRef"]["name"].endswith("-token")
    assert env["MY_VAR"]["value"] == "x"
    if kind == "PyTorchJob":
        assert container["name"] == "pytorch"
        replicas = found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
        # The operator sets MASTER_ADDR and PET_*: the manifest must not override them.
        assert not [n for n in env if n.startswith(("PET_", "MASTER_"))]
    else:
        name = found["Job"]["metadata"]["name"]
        assert found["Job"]["spec"]["completionMode"] == "Indexed"
        assert found["Job"]["spec"]["completions"] == 3 and pod["subdomain"] == name
        assert found["Service"]["spec"]["clusterIP"] == "None"
        assert env["PET_MASTER_ADDR"]["value"] == f"{name}-0.{name}"
        assert "job-completion-index" in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_the_command_runs_torchrun_with_the_operators_topology(profiles, tmp_path):
    """The shell line really sets DLC_NODE_RANK from PET_NODE_RANK and passes the args through
    (run here with `python` replaced by echo, as a pod's /bin/sh would run it), after pointing
    the ranks at the node reporter it starts (replaced by echo too)."""
    import subprocess

    clusters.put_profile("my-k8s", dict(PROFILE, kind="Job"))
    spec = _spec(args=["--lr", "0.1 0.2"])
    found = get_engine("kubernetes").dry_run(_ctx(tmp_path, spec)).native["manifests"]
    command = next(m for m in found if m["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]["command"]
    reporter = "python -m jupyter_dlc.node.reporter & "
    assert reporter in command[2]  # a pod of 4 ranks starts its node reporter first
    line = (command[2].replace(reporter, 'echo "reporter=$DLC_NODE_REPORTER"; ')
            .replace("exec python", 'echo "rank=$DLC_NODE_RANK" python'))
    out = subprocess.run(["/bin/sh", "-c", line, *command[3:]], env={"PET_NODE_RANK": "2", "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, check=True).stdout
    reported, out = out.split("\n", 1)
    assert reported == "reporter=/tmp/dlc-node.reporter"
    # torchrun's command line behind the forked start's agent (node/standby.py --cold)
    assert out.startswith("rank=2 python -m jupyter_dlc.node.standby --cold /dev/null "
                          "-m torch.distributed.run --nproc-per-node=4 --max-restarts=0 --tee=3 ")
    assert out.rstrip().endswith("/dlc/job/script.py --lr 0.1 0.2")


def test_gang_scheduling_kueue_and_volcano(profiles, tmp_path):
    found = _manifests(tmp_path, "Job", gang="kueue", queue="team-a")
    assert found["Job"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert found["Job"]["spec"]["suspend"] is True
    validate(found["Job"])
    found = _manifests(tmp_path, "PyTorchJob", gang="volcano", queue="q")
    validate(found["PyTorchJob"])
    policy = found["PyTorchJob"]["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy == {"minAvailable": 3, "queue": "q"}
    assert _pod_parts(found)[0]["schedulerName"] == "volcano"
    found = _manifests(tmp_path, "Job", gang="volcano")
    validate(found["Job"])
    assert found["PodGroup"]["spec"]["minMember"] == 3  # Volcano's CRD is not in ../shared/k8s
    assert found["Job"]["spec"]["template"]["metadata"]["annotations"][
        "scheduling.k8s.io/group-name"] == found["PodGroup"]["metadata"]["name"]


def test_a_misspelt_field_fails_validation(profiles, tmp_path):
    """The strict schemas catch what an API server would prune or reject."""
    require_crds()
    for kind in ("PyTorchJob", "TrainJob", "Job"):
        found = _manifests(tmp_path, kind)
        bad = found[kind]
        bad["spec"]["nodeSelektor"] = {"a": "b"}
        with pytest.raises(Exception, match="nodeSelektor|additional"):
            validate(bad)
    found = _manifests(tmp_path, "TrainJob")
    found["TrainJob"]["spec"]["trainer"]["numNodes"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        validate(found["TrainJob"])


def test_files_over_the_configmap_limit_name_the_fix_and_the_pvc_carries_them(profiles, tmp_path):
    big = {"data.bin": b"x" * (k8s_manifests.CONFIGMAP_LIMIT + 1)}
    with pytest.raises(k8s_manifests.ManifestError, match=r"^files: .* over the ConfigMap limit .*files: pvc"):
        _manifests(tmp_path, "Job", pushed=big)
    found = _manifests(tmp_path, "Job", pushed=big, files="pvc")
    assert "ConfigMap" not in found
    mounts = found["Job"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "ckpt", "mountPath": "/dlc/job", "subPath": f"jobs/{found['Job']['metadata']['name']}"} in mounts
    validate(found["Job"])


@pytest.mark.parametrize(("options", "message"), [
    ({"kind": "MPIJob"}, "my-k8s.kind: expected one of TrainJob, PyTorchJob, Job, got 'MPIJob'"),
    ({"gang": "yunikorn"}, "my-k8s.gang: expected one of kueue, volcano"),
    ({"tolerations": ["nvidia"]}, "my-k8s.tolerations: expected a list of toleration mappings"),
    ({"namespce": "ml"}, "my-k8s.namespce: unknown option for engine kubernetes"),
])
def test_profile_errors_are_one_line(profiles, options, message):
    with pytest.raises(clusters.ClusterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        clusters.put_profile("my-k8s", dict({"engine": "kubernetes"}, **options))


def test_resource_names_keep_the_attempt_and_stay_short():
    long_id = "a-very-long-job-name-that-goes-on-and-on-and-on-1234-b29860"
    names = {k8s_manifests.resource_name(long_id, a) for a in (1, 12, 13)}
    assert len(names) == 3 and all(len(n) <= 40 and n.endswith(("-a1", "-a12", "-a13")) for n in names)
    assert k8s_manifests.resource_name(long_id, 1) != k8s_manifests.resource_name(long_id + "x", 1)
    assert k8s_manifests.resource_name("Train_B29860", 2) == "dlc-train-b29860-a2"


def test_a_pushed_value_that_cannot_be_a_configmap_key_names_the_fix(profiles, tmp_path):
    with pytest.raises(k8s_manifests.ManifestError, match=r"^files: 'script.py' cannot be a ConfigMap key"):
        _manifests(tmp_path, "Job", pushed={"script.py": b"x"})
