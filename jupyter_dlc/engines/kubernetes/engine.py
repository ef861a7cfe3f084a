"""Kubernetes engine: one TrainJob, PyTorchJob or Indexed Job (+ headless Service) per attempt.

The manifests come from `k8s_manifests.build` (pure dicts); this module adds what needs the
cluster profile and the attempt's files. The ranks do not share the launcher's filesystem:
the script and pushed values travel in a ConfigMap (or on the profile's PVC), checkpoints go
to the PVC, and the ranks report to the launcher by URL (`launcher_url` in the profile).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from ... import layout
from ...spec import JobSpec, network_env
from ..contract import (
    AttemptContext,
    AttemptStatus,
    Capabilities,
    DryRun,
    Engine,
    NodeStatus,
    Phase,
    RankStatus,
    SubmitError,
    reported_records,
)
from ...engine_registry import Option
from . import logs as k8s_logs
from . import manifests as k8s_manifests
from .api import Api, ApiError

API_VERSIONS = {"TrainJob": "trainer.kubeflow.org/v1alpha1", "PyTorchJob": "kubeflow.org/v1",
                "Job": "batch/v1"}
# What each workload's terminal condition is called.
ENDED = {"Complete", "Succeeded", "Failed"}
_RANK_PREFIX = re.compile(r"^\[default(\d+)\]:")


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What the client raises when the API server does not answer (urllib3's own errors)."""
    try:
        import urllib3.exceptions
    except ImportError:
        return ()
    return (urllib3.exceptions.HTTPError,)


def _unreachable() -> tuple[type[BaseException], ...]:
    """Every error that means the API server did not answer (a tuple mypy can check)."""
    return (OSError, *_connection_errors())


def profile_of(spec: JobSpec, lenient: bool = False):
    from ...clusters import engine_profile

    return engine_profile(spec.cluster, "kubernetes", lenient)


def read_job_files(job_dir: str) -> dict[str, bytes]:
    folder = os.path.join(job_dir, "files")
    if not os.path.isdir(folder):
        return {}
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def attempt_env(ctx: AttemptContext, profile) -> dict[str, str]:
    """The env contract as the pods get it: the launcher's DLC_* and EASYCKPT_* for this
    attempt, the launcher's URL as pods reach it, the `--network` variables (NCCL_*, the
    flight recorder's) as every engine sets them; never the token (a Secret carries it)."""
    env = network_env(ctx.spec.network, profile.get("interface"))
    env.update({k: v for k, v in ctx.env.items()
                if k.startswith(("DLC_", "EASYCKPT_")) and k not in ("DLC_TOKEN", "DLC_ATTEMPT_DIR")})
    # A pod cannot write the launcher's attempt directory: its output is the pod log, and
    # its records (pid, exit code, first error) go over the report route.
    env[layout.RECORDS_ENV] = "report"
    if profile.get("launcher_url"):
        env["DLC_LAUNCHER_URL"] = profile.get("launcher_url")
    # The checkpoint directory as the launcher sees it (where it picked the resume step).
    launcher_view = ctx.env.get("DLC_CHECKPOINT_DIR") or ctx.spec.checkpoint_dir or ""
    for key in ("DLC_RESUME_PATH", "EASYCKPT_RESUME_PATH"):
        resume = env.get(key)
        if resume and launcher_view and resume.startswith(launcher_view.rstrip("/") + "/"):
            # The same step, in the job's checkpoint directory on the PVC as the pods see it.
            env[key] = k8s_manifests.checkpoint_dir(ctx.job_id) + resume[len(launcher_view.rstrip("/")):]
    return env


def node_of(pod: dict) -> int:
    """Node index of a pod, by its controller's labels (Job/JobSet index, PyTorchJob replica)."""
    labels = pod["metadata"].get("labels", {})
    if "batch.kubernetes.io/job-completion-index" in labels:
        return int(labels["batch.kubernetes.io/job-completion-index"])
    index = int(labels.get("training.kubeflow.org/replica-index", 0))
    return index + (1 if labels.get("training.kubeflow.org/replica-type") == "worker" else 0)


def pod_state(pod: dict) -> tuple[str, int | None, str | None]:
    """(phase, exit code, the engine's reason when the cluster, not the ranks, decided)."""
    name, status = pod["metadata"]["name"], pod.get("status", {})
    phase = status.get("phase", "Pending")
    where = f"node {node_of(pod)} (pod {name})"
    for cond in status.get("conditions", []):
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return "Failed", None, f"Preempted: {where}: {cond.get('message') or cond.get('reason')}"
    if status.get("reason") == "Evicted":
        return "Failed", None, f"Evicted: {where}: {status.get('message', '')}".rstrip(": ")
    for container in status.get("containerStatuses", []):
        state = container.get("state", {})
        if "terminated" in state:
            ended = state["terminated"]
            if ended.get("reason") == "OOMKilled":
                return phase, ended.get("exitCode"), (f"OOMKilled: {where} ran out of memory; raise "
                                                      "resources.memory or lower the batch size")
            return phase, ended.get("exitCode"), None
        waiting = state.get("waiting", {})
        if waiting.get("reason") in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
            return phase, None, f"{waiting['reason']}: {where}: {waiting.get('message', '')}"
    for cond in status.get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return phase, None, f"Unschedulable: {cond.get('message', '')}"
    return phase, None, None


class KubernetesEngine(Engine):
    submit_verb = "the Kubernetes API"
    name = "kubernetes"
    profile_options = {
        "namespace": Option(str, "a namespace name"), "image": Option(str, "a container image with torch"),
        "kind": Option(str, "TrainJob, PyTorchJob or Job (default: what the cluster serves)",
                       choices=("TrainJob", "PyTorchJob", "Job")),
        "runtime": Option(str, "a ClusterTrainingRuntime name, e.g. torch-distributed"),
        "node_selector": Option(dict, "a mapping of node label to value"),
        "tolerations": Option(list, "a list of toleration mappings", items=dict),
        "gang": Option(str, "kueue or volcano", choices=("kueue", "volcano")),
        "queue": Option(str, "a Kueue LocalQueue or Volcano queue"),
        "pvc": Option(str, "a ReadWriteMany PersistentVolumeClaim name"),
        "files": Option(str, "configmap (default) or pvc", choices=("configmap", "pvc")),
        "kubeconfig": Option(str, "a kubeconfig path (default: in-cluster, else ~/.kube/config)"),
        "context": Option(str, "a kubeconfig context name"),
        "launcher_url": Option(str, "the launcher's URL as pods see it, e.g. http://jupyter-dlc:8787"),
        "launcher_pvc_dir": Option(str, "where the launcher mounts the PVC (in the cluster: "
                                   "/dlc/pvc), so it finds the checkpoints the pods commit")}

    # The supervisor ticks several times a second; an API server is asked about one attempt at
    # most this often (a GET, a pod LIST and the running pods' logs per ask).
    poll_interval = 1.0

    def __init__(self):
        self._apis: dict[str, Api] = {}
        self._kinds: dict[str, str] = {}  # profile -> the kind its cluster served last
        # workload -> (when, the API's answers: the workload and its pods)
        self._seen: dict[str, tuple[float, tuple[dict | None, list[dict]]]] = {}
        self._stopping: set[str] = set()

    def api(self, spec: JobSpec) -> Api:
        profile = profile_of(spec)
        if profile.name not in self._apis:
            self._apis[profile.name] = Api(profile)
        return self._apis[profile.name]

    def kind_for(self, spec: JobSpec) -> str:
        """The profile's kind, else the best the cluster serves (discovery, at each submit:
        remembered for the dry runs that follow, which ask nothing of the API)."""
        profile = profile_of(spec)
        if profile.get("kind"):
            return profile.get("kind")
        groups = self.api(spec).groups()
        self._kinds[profile.name] = ("TrainJob" if "trainer.kubeflow.org" in groups else
                                     "PyTorchJob" if "kubeflow.org" in groups else "Job")
        return self._kinds[profile.name]

    def capabilities(self, spec: JobSpec) -> Capabilities:
        # Without the PVC mounted the launcher cannot plant a branch's step where pods read it.
        return Capabilities(standby_agents=False, shared_filesystem=False, per_rank_signals=False,
                            workdir=False, branches=bool(profile_of(spec, lenient=True).get("launcher_pvc_dir")))

    def checkpoint_dir(self, spec: JobSpec, job_id: str, job_dir: str) -> str:
        """A launcher that mounts the PVC (`launcher_pvc_dir`; the in-cluster one does) reads
        the pods' checkpoints where they commit them; one that does not keeps its own."""
        mount = profile_of(spec, lenient=True).get("launcher_pvc_dir")
        if not mount:
            return super().checkpoint_dir(spec, job_id, job_dir)
        return mount.rstrip("/") + k8s_manifests.checkpoint_dir(job_id)[len(k8s_manifests.PVC_DIR):]

    def capacity_error(self, spec: JobSpec) -> str | None:
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            return "cluster: the kubernetes engine needs the client: pip install 'jupyter-dlc[k8s]'"
        return None

    def pool_driver(self, options: dict[str, Any] | None) -> str:
        return "kubernetes cannot hold a warm pool (pods start per job); jobs start cold"

    def token_secret(self, ctx: AttemptContext) -> str:
        return k8s_manifests.resource_name(ctx.job_id, ctx.attempt) + "-token"

    def dry_run(self, ctx: AttemptContext, kind: str | None = None) -> DryRun:
        """The manifests, asking nothing of the API: the workload's kind is the profile's, or
        what discovery found for it earlier, else `Job` (submit discovers, and builds them
        again where the cluster serves a better kind)."""
        profile = profile_of(ctx.spec)
        kind = kind or profile.get("kind") or self._kinds.get(profile.name) or "Job"
        with open(ctx.script_path) as f:
            script = f.read()
        manifests = k8s_manifests.build(
            ctx.spec, ctx.job_id, ctx.attempt, attempt_env(ctx, profile), script,
            read_job_files(ctx.job_dir), profile.options, kind=kind,
            token_secret=self.token_secret(ctx))
        return DryRun("kubernetes", cluster=profile.name,
                      files={f"{i:02d}-{m['kind'].lower()}.yaml": _yaml(m) for i, m in enumerate(manifests)},
                      native={"kind": kind, "manifests": manifests})

    # -- the live engine --------------------------------------------------------------------
    def submit(self, ctx: AttemptContext, request: DryRun) -> dict[str, Any]:
        api, kind = self.api(ctx.spec), self.kind_for(ctx.spec)
        if request.native["kind"] != kind:  # discovery found what the dry run could not ask
            request = self.dry_run(ctx, kind)
        manifests = request.native["manifests"]
        workload = next(m for m in manifests if m["kind"] == kind)
        meta = workload["metadata"]
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": self.token_secret(ctx), "namespace": meta["namespace"],
                               "labels": k8s_manifests.labels(ctx.job_id, ctx.attempt)},
                  "stringData": {"token": ctx.env["DLC_TOKEN"]}}
        for manifest in [secret, *manifests]:
            try:
                try:
                    api.create(manifest)
                except ApiError as error:
                    if error.status != 409:
                        raise
                    # 409: made by an earlier try of this same attempt, under a fixed name,
                    # so no second workload can exist; but the Secret holds that try's
                    # token, which the store no longer accepts: it is replaced.
                    if manifest is secret:
                        api.delete("v1", "Secret", meta["namespace"], secret["metadata"]["name"])
                        api.create(secret)
            except ApiError as error:
                # 5xx and 429: the API server could not take it now; any other 4xx is about
                # the request itself (an unknown kind, a quota, no right) and would be again.
                raise SubmitError(str(error), permanent=not (error.status >= 500 or error.status == 429)) from None
            except _unreachable() as error:  # no answer from the API server
                raise SubmitError(f"Kubernetes API unreachable: {error}", permanent=False) from None
        return {"engine_id": f"{kind}/{meta['name']}", "kind": kind, "name": meta["name"],
                "namespace": meta["namespace"], "submitted": time.time()}

    def _pods(self, ctx: AttemptContext, handle: dict) -> list[dict]:
        return self.api(ctx.spec).list("v1", "Pod", handle["namespace"],
                                       k8s_manifests.labels(ctx.job_id, ctx.attempt))

    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        # The API is asked at most once a poll interval; the ranks' own records (ctx.reported)
        # are read at every call, so that a caller that reads them again sees them at once.
        asked, answer = self._seen.get(handle["name"], (0.0, None))
        if answer is None or time.monotonic() - asked >= self.poll_interval:
            api, kind = self.api(ctx.spec), handle["kind"]
            answer = (api.get(API_VERSIONS[kind], kind, handle["namespace"], handle["name"]),
                      self._pods(ctx, handle))
            self._seen[handle["name"]] = (time.monotonic(), answer)
            self._copy_logs(ctx, handle, [p for p in answer[1] if pod_state(p)[0] != "Pending"])
        return self._describe(ctx, handle, *answer)

    def _describe(self, ctx: AttemptContext, handle: dict[str, Any], workload: dict | None,
                  pods: list[dict]) -> AttemptStatus:
        kind = handle["kind"]
        conditions = {c["type"] for c in (workload or {}).get("status", {}).get("conditions", [])
                      if c.get("status") == "True"}
        status = AttemptStatus(phase=Phase.RUNNING)
        nproc = ctx.spec.nproc_per_node
        records, _ = reported_records(ctx.reported)
        reasons, pending = [], []
        for pod in sorted(pods, key=node_of):
            node = node_of(pod)
            phase, code, reason = pod_state(pod)
            if reason:
                reasons.append((phase, reason))
            if phase == "Pending":
                pending.append(pod)
            running = phase == "Running"
            status.alive = status.alive or phase in ("Pending", "Running")
            status.nodes.append(NodeStatus(node, running, code))
            for rank in range(node * nproc, (node + 1) * nproc):
                # A rank's own exit code, from the record it reported; the pod's (torchrun's,
                # the container's PID 1) only for a rank that could not report (killed).
                own = records.get(rank, {})
                rank_code = own.get("exit_code", code)
                status.ranks[rank] = RankStatus(
                    rank, pid=own.get("pid") or (1 if phase != "Pending" else None),
                    running=running and own.get("exit_code") is None, exit_code=rank_code,
                    start=own.get("start"), end=own.get("end"))
        ended_by_cluster = [r for phase, r in reasons if phase != "Pending"]
        if ended_by_cluster:
            status.reason = ended_by_cluster[0]
        elif workload is None:
            # Gone: deleted by our stop (foreground: its pods went first), or by someone else.
            status.phase = Phase.RUNNING if status.alive else Phase.ENDED
            if handle["name"] not in self._stopping:
                status.reason = f"the {kind} {handle['name']} was deleted outside the launcher"
        elif pending or (not pods and not conditions & ENDED):
            status.phase = Phase.PENDING
            status.alive = True
            status.reason = (reasons[0][1] if reasons else
                             f"{len(pending) or ctx.spec.nodes} of {ctx.spec.nodes} pod(s) pending; "
                             "logs start when they run")
        elif not status.alive and conditions & ENDED:
            status.phase = Phase.ENDED
        return status

    def _copy_logs(self, ctx: AttemptContext, handle: dict, pods: list[dict]) -> None:
        """New lines of the pods' logs into the attempt's rank logs, by torchrun's rank prefix,
        so the launcher's views read them as they read every engine's. Only what is new is
        asked of the API (k8s_logs: timestamps and sinceTime, a cursor per pod)."""
        cursors = k8s_logs.load_cursors(ctx.attempt_dir)
        before = dict(cursors)
        api = self.api(ctx.spec)
        for pod in pods:
            name, node = pod["metadata"]["name"], node_of(pod)

            def fetch(since: str | None, name: str = name) -> str:
                return api.pod_log(handle["namespace"], name, since_time=since, timestamps=True)

            try:
                lines, cursor = k8s_logs.new_lines(fetch, cursors.get(name))
            except ApiError:
                continue
            if cursor is not None:
                cursors[name] = cursor
            if lines:
                self._append_rank_logs(ctx, node, lines)
        if cursors != before:
            k8s_logs.save_cursors(ctx.attempt_dir, cursors)

    def _append_rank_logs(self, ctx: AttemptContext, node: int, lines: list[str]) -> None:
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        by_rank: dict[int | None, list[str]] = {}
        for line in lines:
            match = _RANK_PREFIX.match(line)
            rank = node * ctx.spec.nproc_per_node + int(match.group(1)) if match else None
            by_rank.setdefault(rank, []).append(line[match.end():] if match else line)
        for rank, taken in by_rank.items():
            path = (layout.rank_log(ctx.attempt_dir, rank) if rank is not None
                    else layout.node_log(ctx.attempt_dir, node))
            with open(path, "a") as f:
                f.write("".join(line + "\n" for line in taken))

    def _delete_all(self, ctx: AttemptContext, handle: dict, grace: int | None) -> None:
        api, ns = self.api(ctx.spec), handle["namespace"]
        self._stopping.add(handle["name"])
        self._seen.pop(handle["name"], None)  # the next describe sees the deletion
        api.delete(API_VERSIONS[handle["kind"]], handle["kind"], ns, handle["name"], grace)

    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        """Delete the workload, its pods first (foreground): the kubelet sends SIGTERM and waits
        `grace` seconds, as the supervisor's polite stop asks."""
        self._delete_all(ctx, handle, int(grace))

    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        self._delete_all(ctx, handle, 0)

    def cleanup(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        """The attempt's ConfigMap, Service, token Secret (and PodGroup) once it has ended."""
        api, ns, name = self.api(ctx.spec), handle["namespace"], handle["name"]
        for api_version, kind, suffix in (("v1", "Secret", "-token"), ("v1", "ConfigMap", "-files"),
                                          ("v1", "Service", ""),
                                          ("scheduling.volcano.sh/v1beta1", "PodGroup", "")):
            try:
                api.delete(api_version, kind, ns, name + suffix)
            except ApiError:
                pass  # absent for this kind, or no right to it: nothing of ours is left there
        self._stopping.discard(name)

    def adopt(self, ctx: AttemptContext) -> dict[str, Any] | None:
        """The attempt's workload, found by its labels (a launcher killed before it stored
        the handle that submit returned)."""
        return next((h for h in self.workloads(ctx.spec, ctx.job_id) if h["attempt"] == ctx.attempt),
                    None)

    def workloads(self, spec: JobSpec, job_id: str) -> list[dict[str, Any]]:
        """Workloads of `job_id` that the cluster still has, by attempt, found by their labels."""
        profile = profile_of(spec)
        namespace = profile.get("namespace") or k8s_manifests.DEFAULT_NAMESPACE
        found = []
        for kind, api_version in API_VERSIONS.items():
            try:
                selector = {k8s_manifests.LABEL_JOB: k8s_manifests.labels(job_id, 0)[k8s_manifests.LABEL_JOB]}
                items = self.api(spec).list(api_version, kind, namespace, selector)
            except ApiError:
                continue  # that kind is not served here
            found += [{"engine_id": f"{kind}/{i['metadata']['name']}", "kind": kind,
                       "name": i["metadata"]["name"], "namespace": namespace,
                       "attempt": int(i["metadata"]["labels"][k8s_manifests.LABEL_ATTEMPT])} for i in items]
        return sorted(found, key=lambda h: h["attempt"])

    def check(self, profile) -> dict[str, Any]:
        api = Api(profile)
        groups = api.groups()
        kinds = [k for k, g in (("TrainJob", "trainer.kubeflow.org"), ("PyTorchJob", "kubeflow.org"))
                 if g in groups] + ["Job"]
        return {"ok": True, "detail": f"serves {', '.join(kinds)}"}

    # -- an exported bundle ------------------------------------------------------------------
    def export_files(self, spec: JobSpec, script: str, files: dict[str, str], job_id: str,
                     exports: list[str]) -> dict[str, str]:
        """`k8s/*.yaml` of an exported bundle, whichever engine ran the job: `kubectl apply -f k8s/`
        runs it with plain torchrun (no launcher: no token, no launcher URL). Options come from
        the job's Kubernetes profile when it has one here; else the defaults name what to edit."""
        import yaml

        from ...spec import params_env

        profile = profile_of(spec, lenient=True)
        options = dict(profile.options)
        # The environment every rank gets (README), less the launcher's URL and token; the pod
        # command sets DLC_NODE_RANK, the manifests DLC_JOB_DIR and DLC_CHECKPOINT_DIR.
        env = {"DLC_JOB_ID": job_id or spec.name, "DLC_JOB_NAME": spec.name, "DLC_NNODES": str(spec.nodes),
               "DLC_NPROC_PER_NODE": str(spec.nproc_per_node), "DLC_ATTEMPT": "1",
               "DLC_RESUME_PATH": "", "EASYCKPT_RESUME_PATH": "", "DLC_NODE_COPY": "0",
               # A branch's step is on this machine, not where pods read: the manifests start afresh.
               "DLC_BRANCH_FROM": "", "DLC_FRESH_OPTIMIZER": "", **params_env(spec.params),
               **network_env(spec.network, profile.get("interface"))}
        pushed = {}
        for name, path in files.items():
            with open(path, "rb") as f:
                pushed[name] = f.read()
        job_id = spec.name or "job"
        name = k8s_manifests.resource_name(job_id, 1)
        notes = [f"# jupyter-dlc export of job {spec.name!r}: kubectl apply -f k8s/ (in file order)."]
        if not profile.options:
            notes.append(f"# Defaults to edit: namespace {k8s_manifests.DEFAULT_NAMESPACE!r}, image "
                         f"{k8s_manifests.DEFAULT_IMAGE!r} (needs torch), PVC 'dlc-checkpoints'.")
        try:
            manifests = k8s_manifests.build(spec, job_id, 1, env, script, pushed, options, bootstrap=False)
        except k8s_manifests.ManifestError:
            options["files"] = "pvc"  # too big for a ConfigMap: the files go on the PVC
            manifests = k8s_manifests.build(spec, job_id, 1, env, script, pushed, options, bootstrap=False)
            notes.append(f"# script.py and files/ are too big for a ConfigMap: copy them to the PVC "
                         f"at jobs/{name}/ before applying.")
        namespace = options.get("namespace") or k8s_manifests.DEFAULT_NAMESPACE
        manifests.insert(0, k8s_manifests.pvc(options.get("pvc") or "dlc-checkpoints", namespace))
        header = "\n".join(notes) + "\n"
        return {f"k8s/{i:02d}-{m['kind'].lower()}.yaml": header + yaml.safe_dump(m, sort_keys=False)
                for i, m in enumerate(manifests)}



def _yaml(manifest: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(manifest, sort_keys=False)
