"""Kubernetes manifests for one attempt of a job: plain dicts, no client needed.

What is built, by `kind` (a profile's `kind`, else what the cluster serves):
- `TrainJob`   Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1) against a
               ClusterTrainingRuntime (`runtime`, default torch-distributed); our volumes and
               labels go in through `runtimePatches` on the runtime's `node` replicated job;
- `PyTorchJob` Training Operator v1 (kubeflow.org/v1): one Master + nodes-1 Workers, the
               container named `pytorch` as the operator requires;
- `Job`        an Indexed batch/v1 Job with a headless Service: node K is completion index K,
               node 0 answers at `<name>-0.<name>`.
Always: a ConfigMap with the cell's script and pushed values, mounted at /dlc/job (or, where
they do not fit, the PVC), a /dev/shm emptyDir, the PVC at /dlc/pvc (checkpoints under jobs/<job>/checkpoints).

The env contract: the operator's variables (PET_*, MASTER_ADDR) stand; torchrun reads PET_<FLAG>
as that flag's default, so the command names only --nproc-per-node; DLC_* and
EASYCKPT_RESUME_PATH are added. The token is never in a manifest: the pods read it from a
Secret the engine creates (`token_secret`), and `export` leaves it out (no launcher there).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ... import shell
from ...node import reporter as node_reporter
from ...node.standby import cold_argv
from ...spec import JobSpec
from ..torchrun import forked_start_wanted

KINDS = ("TrainJob", "PyTorchJob", "Job")
DEFAULT_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"  # a user edits this
DEFAULT_NAMESPACE = "default"
DEFAULT_RUNTIME = "torch-distributed"
PORT = 29500
JOB_DIR = "/dlc/job"
PVC_DIR = "/dlc/pvc"  # the shared claim; each job keeps its checkpoints under jobs/<job>/
REPORTER_FILE = "/tmp/dlc-node.reporter"  # the pod's own: where its ranks find their node reporter
# A ConfigMap holds at most 1 MiB (etcd's object limit) with its metadata.
CONFIGMAP_LIMIT = 900 * 1024
MANAGED_BY = "jupyter-dlc"
LABEL_JOB = "dlc.jupyter.org/job-id"
LABEL_ATTEMPT = "dlc.jupyter.org/attempt"
_DNS = re.compile(r"[^a-z0-9-]+")


class ManifestError(ValueError):
    """One line naming the field and the fix."""


def resource_name(job_id: str, attempt: int) -> str:
    """An RFC 1123 label short enough for pod names `<name>-master-0-xxxxx`, `<name>-0`."""
    import hashlib

    job = _DNS.sub("-", job_id.lower()).strip("-")
    suffix = f"-a{attempt}"
    room = 40 - len("dlc-") - len(suffix)
    if len(job) > room:  # keep the attempt; a digest of the whole id keeps long ids apart
        job = job[:room - 7].rstrip("-") + "-" + hashlib.sha256(job_id.encode()).hexdigest()[:6]
    return f"dlc-{job}{suffix}"


def labels(job_id: str, attempt: int) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_JOB: _DNS.sub("-", job_id.lower()),
            LABEL_ATTEMPT: str(attempt)}


def _resources(spec: JobSpec) -> dict[str, Any]:
    res = spec.resources
    amounts = {"cpu": str(res.get("cpus") or spec.nproc_per_node)}
    if res.get("memory_mb"):
        amounts["memory"] = f"{res['memory_mb']}Mi"
    if res.get("gpus"):
        amounts["nvidia.com/gpu"] = str(res["gpus"])
    # GPUs must have requests == limits; the same for CPU and memory gives Guaranteed QoS.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def checkpoint_dir(job_id: str) -> str:
    """Where a job's checkpoints live in its pods (on the PVC), the same for every attempt."""
    return f"{PVC_DIR}/jobs/{_DNS.sub('-', job_id.lower())}/checkpoints"


def _env(spec: JobSpec, job_id: str, env: dict[str, str], token_secret: str | None,
         rank_from_index: bool) -> list[dict[str, Any]]:
    """DLC_* and the user's variables; the operator's own (PET_*, MASTER_*) are not set here
    except for the Indexed Job, which has no operator."""
    mine = {k: v for k, v in env.items() if k not in ("DLC_TOKEN", "DLC_NODE_RANK")
            and not k.startswith(("PET_", "MASTER_"))}
    mine.update({"DLC_JOB_DIR": JOB_DIR, "DLC_CHECKPOINT_DIR": checkpoint_dir(job_id),
                 "PYTHONUNBUFFERED": "1"})
    mine.update(spec.env)
    out: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in mine.items()]
    if token_secret:
        out.append({"name": "DLC_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": token_secret, "key": "token"}}})
    if rank_from_index:
        out.append({"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    return out


def _command(spec: JobSpec, bootstrap: bool) -> list[str]:
    """torchrun with its topology from PET_* (set by the operator or by us), via a shell so
    that DLC_NODE_RANK follows whichever PET_NODE_RANK the pod got. A pod of more than one
    rank first starts its node reporter (node/reporter.py), as a Slurm or SSH node does: its
    ranks' reports go to the launcher as one batch per node. It runs beside torchrun, which
    the shell becomes (PID 1 of the container), and leaves when torchrun does."""
    module = "-m jupyter_dlc.runtime.bootstrap " if bootstrap else ""
    reporter = ""
    if bootstrap and node_reporter.wanted(spec.nproc_per_node):
        reporter = node_reporter.shell_start("python", shell.quote(REPORTER_FILE))
    # The agent imports torch once and forks its ranks, as on every engine
    # (torchrun.forked_start_wanted); the pod's status carries its exit code.
    agent = ["python", "-m", "torch.distributed.run"]
    if bootstrap and forked_start_wanted(spec):
        agent = cold_argv(agent, os.devnull)
    line = ('export DLC_NODE_RANK="${PET_NODE_RANK:-0}"; ' + reporter +
            f"exec {' '.join(agent)} --nproc-per-node={spec.nproc_per_node} "
            # --tee 3: each line in the pod log carries its rank's [default<local rank>]: prefix.
            f'--max-restarts=0 --tee=3 {module}{shell.quote(JOB_DIR + "/script.py")} "$@"')
    return ["/bin/sh", "-c", line, "dlc"] + list(spec.args)


def _volumes(names: dict[str, str], files_on_pvc: bool) -> tuple[list, list]:
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
               {"name": "ckpt", "persistentVolumeClaim": {"claimName": names["pvc"]}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                    {"name": "ckpt", "mountPath": PVC_DIR}]
    if files_on_pvc:
        mounts.append({"name": "ckpt", "mountPath": JOB_DIR, "subPath": f"jobs/{names['base']}"})
    else:
        volumes.append({"name": "job", "configMap": {"name": names["base"] + "-files"}})
        mounts.append({"name": "job", "mountPath": JOB_DIR, "readOnly": True})
    return volumes, mounts


def config_map(name: str, namespace: str, meta_labels: dict, script: str,
               files: dict[str, bytes]) -> dict[str, Any]:
    import base64

    for key in files:
        if not re.fullmatch(r"[-._a-zA-Z0-9]+", key) or key == "script.py":
            raise ManifestError(f"files: {key!r} cannot be a ConfigMap key (letters, digits, '-', '_', "
                                "'.'); rename it, or set the profile's `files: pvc`")
    size = len(script.encode()) + sum(len(v) for v in files.values())
    if size > CONFIGMAP_LIMIT:
        raise ManifestError(f"files: the script and pushed values are {size // 1024} KiB, over the "
                            f"ConfigMap limit of {CONFIGMAP_LIMIT // 1024} KiB; set the profile's "
                            "`files: pvc` to carry them on the PVC")
    manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
                "data": {"script.py": script}}
    if files:
        # A ConfigMap key is a file name ([-._a-zA-Z0-9]+); pushed values are binary.
        manifest["binaryData"] = {k: base64.b64encode(v).decode() for k, v in files.items()}
    return manifest


def build(spec: JobSpec, job_id: str, attempt: int, env: dict[str, str], script: str,
          files: dict[str, bytes], options: dict[str, Any], kind: str | None = None,
          token_secret: str | None = None, bootstrap: bool = True) -> list[dict[str, Any]]:
    """The attempt's manifests, in the order to apply them (ConfigMap first)."""
    kind = options.get("kind") or kind or "Job"
    if kind not in KINDS:
        raise ManifestError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    namespace = options.get("namespace") or DEFAULT_NAMESPACE
    base = resource_name(job_id, attempt)
    names = {"base": base, "pvc": options.get("pvc") or "dlc-checkpoints"}
    meta_labels = labels(job_id, attempt)
    files_on_pvc = options.get("files") == "pvc"
    volumes, mounts = _volumes(names, files_on_pvc)
    gang = options.get("gang")
    top_labels = dict(meta_labels)
    if gang == "kueue":
        top_labels["kueue.x-k8s.io/queue-name"] = options.get("queue") or "default"
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "volumes": volumes}
    if options.get("node_selector"):
        pod_spec["nodeSelector"] = dict(options["node_selector"])
    if options.get("tolerations"):
        pod_spec["tolerations"] = list(options["tolerations"])
    if gang == "volcano":
        pod_spec["schedulerName"] = "volcano"
    pod_spec["terminationGracePeriodSeconds"] = int(spec.stop_grace)
    image = options.get("image") or DEFAULT_IMAGE
    container = {"image": image, "command": _command(spec, bootstrap),
                 "env": _env(spec, job_id, env, token_secret, kind == "Job"),
                 "resources": _resources(spec), "volumeMounts": mounts}
    out = [] if files_on_pvc else [config_map(base + "-files", namespace, meta_labels, script, files)]
    meta = {"name": base, "namespace": namespace, "labels": top_labels}
    if kind == "TrainJob":
        out.append(_trainjob(spec, meta, meta_labels, container, pod_spec, options))
    elif kind == "PyTorchJob":
        out.append(_pytorchjob(spec, meta, meta_labels, container, pod_spec, options))
    else:
        out.extend(_indexed_job(spec, meta, meta_labels, container, pod_spec, options))
    return out


def _trainjob(spec, meta, pod_labels, container, pod_spec, options) -> dict[str, Any]:
    # The runtime's container is `node` in replicated job `node`; command, env and resources
    # go through `trainer`, volumes and scheduling through a runtime patch.
    patch_spec = {k: v for k, v in pod_spec.items()
                  if k in ("nodeSelector", "tolerations", "volumes", "terminationGracePeriodSeconds")}
    patch_spec["containers"] = [{"name": "node", "volumeMounts": container["volumeMounts"]}]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": meta,
            "spec": {
                "runtimeRef": {"name": options.get("runtime") or DEFAULT_RUNTIME},
                "trainer": {"image": container["image"], "command": container["command"][:4],
                            "args": container["command"][4:], "env": container["env"],
                            "numNodes": spec.nodes, "numProcPerNode": spec.nproc_per_node,
                            "resourcesPerNode": container["resources"]},
                "runtimePatches": [{"manager": "dlc.jupyter.org/launcher", "trainingRuntimeSpec": {
                    "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
                        "template": {"metadata": {"labels": pod_labels}, "spec": patch_spec}}}}]}}}}]}}


def _pytorchjob(spec, meta, pod_labels, container, pod_spec, options) -> dict[str, Any]:
    template = {"metadata": {"labels": pod_labels},
                "spec": dict(pod_spec, containers=[dict(container, name="pytorch")])}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": "Never", "template": template}
    run_policy: dict[str, Any] = {"backoffLimit": 0, "cleanPodPolicy": "None"}
    if options.get("gang") == "volcano":
        run_policy["schedulingPolicy"] = {"minAvailable": spec.nodes,
                                          "queue": options.get("queue") or "default"}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
            "spec": {"pytorchReplicaSpecs": replicas, "runPolicy": run_policy,
                     "nprocPerNode": str(spec.nproc_per_node)}}


def _indexed_job(spec, meta, pod_labels, container, pod_spec, options) -> list[dict[str, Any]]:
    name = meta["name"]
    topology = [{"name": "PET_NNODES", "value": str(spec.nodes)},
                {"name": "PET_MASTER_ADDR", "value": f"{name}-0.{name}"},
                {"name": "PET_MASTER_PORT", "value": str(PORT)}]
    container = dict(container, name="node", env=container["env"] + topology,
                     ports=[{"containerPort": PORT, "name": "rendezvous"}])
    template_labels = dict(pod_labels)
    annotations = {}
    if options.get("gang") == "volcano":
        annotations["scheduling.k8s.io/group-name"] = name
    pod_meta = {"labels": template_labels}
    if annotations:
        pod_meta["annotations"] = annotations
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
           "spec": {"completionMode": "Indexed", "completions": spec.nodes,
                    "parallelism": spec.nodes, "backoffLimit": 0,
                    # One node failing ends the job: the launcher restarts it whole.
                    "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                        "operator": "NotIn", "values": [0]}}]},
                    "template": {"metadata": pod_meta,
                                 "spec": dict(pod_spec, subdomain=name, containers=[container])}}}
    if options.get("gang") == "kueue":
        job["spec"]["suspend"] = True  # Kueue admits it by un-suspending
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": meta["namespace"], "labels": pod_labels},
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {"batch.kubernetes.io/job-name": name},
                        "ports": [{"name": "rendezvous", "port": PORT}]}}
    out = [service, job]
    if options.get("gang") == "volcano":
        out.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": name, "namespace": meta["namespace"], "labels": pod_labels},
                    "spec": {"minMember": spec.nodes, "queue": options.get("queue") or "default"}})
    return out


def pvc(name: str, namespace: str, size: str = "100Gi", storage_class: str | None = None) -> dict:
    """The ReadWriteMany claim for checkpoints and job files, shared by every node."""
    manifest: dict[str, Any] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
                "spec": {"accessModes": ["ReadWriteMany"],
                         "resources": {"requests": {"storage": size}}}}
    if storage_class:
        manifest["spec"]["storageClassName"] = storage_class
    return manifest
