"""A Kubernetes API stand-in for tests, on loopback: no API server can run on these machines
(../shared/FIELD-NOTES.md), and kmock answers custom-object creates with 200 and fails
create_namespace, so this small one keeps the semantics the engine depends on:

- create 201 (409 AlreadyExists), get 404 NotFound, delete 200 with a Status (404 when gone),
  a growing resourceVersion, list with equality label selectors, watch (events from a
  resourceVersion; 410 Gone when that version is older than the kept history);
- pod logs as text/plain, 400 "waiting to start" while a pod is pending, follow streams until
  the pod ends, `timestamps` and `sinceTime` as the kubelet serves them (bytes served are
  counted per pod);
- discovery (/apis) answers the groups it was told it serves.

It also plays the operator and the kubelet: a created TrainJob, PyTorchJob or Job gets its pods
with the operator's naming, labels and env (PET_*, MASTER_ADDR), Pending until the test moves
them (`run`, `finish`, `oom`, `unschedulable`, `evict`, `image_pull_backoff`), and the workload's
conditions follow its pods. What a real cluster adds: scheduling, admission webhooks, CEL rules,
server-side defaults, real containers and their logs, garbage collection by owner references.

With a `Kubelet` attached (`Standin(kubelet=Kubelet(root, pvc_dir))`) it runs each pod's
container for real, as a process of this machine: the workload's command and env (the token
from its Secret, the script from its ConfigMap), the pod's paths (/dlc, /dlc/pvc, the node
reporter's file) moved under `root` (the PVC to `pvc_dir`, which a launcher with
`launcher_pvc_dir` sees), and the operator's rendezvous at 127.0.0.1. Its output is the pod
log, its exit the container's; a delete sends SIGTERM and, after the grace, SIGKILL. So the
engine conformance suite runs real torchrun ranks through the Kubernetes engine. No image,
no pod network, no cgroup limits: those a real cluster adds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PLURALS = {"configmaps": "ConfigMap", "services": "Service", "secrets": "Secret", "pods": "Pod",
           "jobs": "Job", "pytorchjobs": "PyTorchJob", "trainjobs": "TrainJob",
           "podgroups": "PodGroup", "persistentvolumeclaims": "PersistentVolumeClaim"}
WORKLOADS = ("Job", "PyTorchJob", "TrainJob")
_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))/namespaces/(?P<ns>[^/]+)/"
                   r"(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status))?$")
HISTORY = 200  # watch events kept; older resourceVersions answer 410 Gone


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that went away mid-answer (a launcher shutting down) is not an error here.
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)


class Standin:
    def __init__(self, groups=("batch",), kubelet: Kubelet | None = None):
        self.groups = set(groups) | {"batch"}
        self.kubelet = kubelet
        # namespace -> (code, reason, message): every create there is refused so (an admission
        # webhook or RBAC saying no), as the API answers a 4xx
        self.refuse: dict[str, tuple[int, str, str]] = {}
        self.objects: dict[tuple, dict] = {}  # (plural, ns, name) -> object
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
        self.deletes: list[dict] = []  # what each DELETE asked (grace, propagation)
        self.logs: dict[tuple, str] = {}  # (ns, pod) -> text
        self.log_times: dict[tuple, list[str]] = {}  # (ns, pod) -> each line's RFC3339Nano time
        self.log_bytes_served: dict[tuple, int] = {}  # (ns, pod) -> log bytes sent, all reads
        self.rv = 1000
        self.lock = threading.Condition()
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.kubelet is not None:
            self.kubelet.close()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: str) -> str:
        import yaml

        config = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
                  "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                  "users": [{"name": "u", "user": {"token": "standin-token"}}],
                  "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "u"}}]}
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    # -- storage, with resourceVersions and events ------------------------------------------
    def _put(self, plural: str, obj: dict, event: str) -> dict:
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            meta = obj["metadata"]
            self.objects[(plural, meta["namespace"], meta["name"])] = obj
            self.events.append((self.rv, plural, event, json.loads(json.dumps(obj))))
            del self.events[:-HISTORY]
            self.lock.notify_all()
            return obj

    def _remove(self, plural: str, ns: str, name: str) -> dict | None:
        with self.lock:
            obj = self.objects.pop((plural, ns, name), None)
            if obj is not None:
                self.rv += 1
                self.events.append((self.rv, plural, "DELETED", obj))
                if plural == "pods":
                    self.logs.setdefault((ns, name), "")
                self.lock.notify_all()
            return obj

    def create(self, plural: str, ns: str, body: dict) -> tuple[int, dict]:
        meta = body.setdefault("metadata", {})
        meta["namespace"] = ns
        # Under the lock throughout: a test that sees the workload sees all its pods too. (A
        # real operator creates them a moment later; a test that ran "every pod" in between
        # would leave the late ones Pending, as CI once caught.)
        if ns in self.refuse:
            code, reason, message = self.refuse[ns]
            return code, _status(code, reason, message)
        with self.lock:
            if (plural, ns, meta.get("name")) in self.objects:
                return 409, _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            meta.update(uid=str(uuid.uuid4()),
                        creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            obj = self._put(plural, body, "ADDED")
            if body.get("kind") in WORKLOADS:
                self._operator(body)
        if body.get("kind") in WORKLOADS and self.kubelet is not None:
            self.kubelet.start(self, body)
        return 201, obj

    # -- the operator's part --------------------------------------------------------------
    def _operator(self, workload: dict) -> None:
        """Pods with the conventions of the workload's controller, all Pending."""
        kind, name, ns = workload["kind"], workload["metadata"]["name"], workload["metadata"]["namespace"]
        spec = workload["spec"]
        if kind == "Job":
            template, nodes = spec["template"], spec["completions"]
            pods = [(f"{name}-{i}-{uuid.uuid4().hex[:5]}", i,
                     {"batch.kubernetes.io/job-name": name, "batch.kubernetes.io/job-completion-index": str(i)},
                     {"PET_NODE_RANK": str(i)}) for i in range(nodes)]
        elif kind == "PyTorchJob":
            replicas = spec["pytorchReplicaSpecs"]
            template = replicas["Master"]["template"]
            workers = replicas.get("Worker", {}).get("replicas", 0)
            nodes = 1 + workers
            common = {"MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": str(nodes),
                      "PET_MASTER_ADDR": f"{name}-master-0", "PET_MASTER_PORT": "23456",
                      "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(spec.get("nprocPerNode", "1"))}
            pods = [(f"{name}-master-0", 0, {"training.kubeflow.org/job-name": name,
                                               "training.kubeflow.org/replica-type": "master",
                                               "training.kubeflow.org/replica-index": "0"},
                     dict(common, RANK="0", PET_NODE_RANK="0"))]
            pods += [(f"{name}-worker-{i}", i + 1, {"training.kubeflow.org/job-name": name,
                                                    "training.kubeflow.org/replica-type": "worker",
                                                    "training.kubeflow.org/replica-index": str(i)},
                      dict(common, RANK=str(i + 1), PET_NODE_RANK=str(i + 1))) for i in range(workers)]
        else:  # TrainJob on a JobSet: replicated job `node`, pods <name>-node-0-<i>-xxxxx
            patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
            template = patch["template"]["spec"]["template"]
            template = {"metadata": template["metadata"], "spec": {
                "containers": [{"name": "node", "image": spec["trainer"]["image"], "env": spec["trainer"]["env"]}]}}
            nodes = spec["trainer"]["numNodes"]
            pods = [(f"{name}-node-0-{i}-{uuid.uuid4().hex[:5]}", i,
                     {"jobset.sigs.k8s.io/jobset-name": name, "batch.kubernetes.io/job-completion-index": str(i)},
                     {"PET_NODE_RANK": str(i), "PET_NNODES": str(nodes),
                      "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500"})
                    for i in range(nodes)]
        for pod_name, _index, extra_labels, env in pods:
            labels = dict(template.get("metadata", {}).get("labels", {}), **extra_labels)
            container = template["spec"]["containers"][0]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                "uid": str(uuid.uuid4()), "ownerReferences": [{
                                    "apiVersion": workload["apiVersion"], "kind": kind, "name": name,
                                    "uid": workload["metadata"]["uid"], "controller": True}]},
                   "spec": {"containers": [{"name": container["name"], "image": container["image"],
                                            "env": list(container.get("env", []))
                                            + [{"name": k, "value": v} for k, v in env.items()]}]},
                   "status": {"phase": "Pending", "conditions": []}}
            self._put("pods", pod, "ADDED")

    def pods(self, workload: str) -> list[dict]:
        with self.lock:
            return sorted((o for (p, _, _), o in self.objects.items() if p == "pods"
                           and o["metadata"]["ownerReferences"][0]["name"] == workload),
                          key=lambda o: o["metadata"]["name"])

    def _pod_update(self, pod: dict, phase: str, **status) -> None:
        pod = json.loads(json.dumps(pod))
        pod["status"].update(phase=phase, **status)
        self._put("pods", pod, "MODIFIED")

    def _container(self, pod: dict, state: dict) -> list[dict]:
        container = pod["spec"]["containers"][0]
        return [{"name": container["name"], "image": container["image"], "imageID": "",
                 "restartCount": 0, "state": state, "ready": "running" in state}]

    def run(self, workload: str, lines_per_pod: int = 2) -> None:
        """Every pod scheduled and running, each writing lines its ranks would print."""
        for pod in self.pods(workload):
            node = _node_of(pod)
            self.write_log(pod["metadata"]["namespace"], pod["metadata"]["name"], "".join(
                f"[default{r}]:node {node} line {r}\n" for r in range(lines_per_pod)))
            self._pod_update(pod, "Running", containerStatuses=self._container(
                pod, {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}),
                conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
        self._conditions(workload, "Running")

    def write_log(self, ns: str, pod: str, text: str, at: float | None = None) -> None:
        """Append to a pod's log as its container would; each line is stamped with the time
        its newline was written (as the kubelet stamps what `timestamps=true` shows), or
        with `at` (epoch seconds): lines the container wrote that long ago."""
        when = time.time_ns() if at is None else int(at * 1e9)
        with self.lock:
            self.logs[(ns, pod)] = self.logs.get((ns, pod), "") + text
            self.log_times.setdefault((ns, pod), []).extend(
                [_rfc3339nano(when + i) for i in range(text.count("\n"))])
            self.lock.notify_all()

    def log_text(self, ns: str, pod: str, query: dict) -> str:
        """The log as the API answers a read: `sinceTime` (whole seconds, RFC3339) keeps the
        lines from that second on, `timestamps` prefixes each with its time."""
        with self.lock:
            text = self.logs.get((ns, pod), "")
            times = list(self.log_times.get((ns, pod), []))
        if not query.get("sinceTime") and query.get("timestamps") not in ("true", "1"):
            return text
        lines = text.splitlines(keepends=True)
        times += [_rfc3339nano(time.time_ns())] * (len(lines) - len(times))  # a partial last line
        since = query.get("sinceTime", "")[:19]
        stamp = query.get("timestamps") in ("true", "1")
        return "".join((f"{t} " if stamp else "") + line for t, line in zip(times, lines, strict=True)
                       if t[:19] >= since)

    def finish(self, workload: str, codes: dict[int, int] | None = None) -> None:
        for pod in self.pods(workload):
            code = (codes or {}).get(_node_of(pod), 0)
            self._terminate(pod, code, "Completed" if code == 0 else "Error")
        failed = any((codes or {}).values())
        self._conditions(workload, "Failed" if failed else "Succeeded")

    def oom(self, workload: str, node: int) -> None:
        pod = next(p for p in self.pods(workload) if _node_of(p) == node)
        self._terminate(pod, 137, "OOMKilled")
        self._conditions(workload, "Failed")

    def evict(self, workload: str, node: int, preempted: bool = False) -> None:
        pod = next(p for p in self.pods(workload) if _node_of(p) == node)
        if preempted:
            self._pod_update(pod, "Failed", conditions=[{
                "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": "Preempted in order to admit critical pod"}])
        else:
            self._pod_update(pod, "Failed", reason="Evicted",
                             message="The node was low on resource: memory.")

    def unschedulable(self, workload: str, message: str) -> None:
        for pod in self.pods(workload):
            self._pod_update(pod, "Pending", conditions=[{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}])

    def image_pull_backoff(self, workload: str) -> None:
        for pod in self.pods(workload):
            self._pod_update(pod, "Pending", containerStatuses=self._container(pod, {"waiting": {
                "reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}))

    def _terminate(self, pod: dict, code: int, reason: str) -> None:
        self._pod_update(pod, "Succeeded" if code == 0 else "Failed", containerStatuses=self._container(
            pod, {"terminated": {"exitCode": code, "reason": reason}}))

    def _conditions(self, workload: str, state: str) -> None:
        for (plural, _ns, name), obj in list(self.objects.items()):
            if name != workload or obj.get("kind") not in WORKLOADS:
                continue
            obj = json.loads(json.dumps(obj))
            kind = obj["kind"]
            word = {"Job": {"Succeeded": "Complete"}, "TrainJob": {"Succeeded": "Complete"}}.get(
                kind, {}).get(state, state)
            obj["status"] = {"conditions": [{"type": word, "status": "True", "reason": word}]}
            self._put(plural, obj, "MODIFIED")

    # -- reads ----------------------------------------------------------------------------
    def list(self, plural: str, ns: str, selector: str | None) -> dict:
        wanted = dict(p.split("=", 1) for p in selector.split(",")) if selector else {}
        with self.lock:
            items = [o for (p, n, _), o in self.objects.items() if p == plural and n == ns
                     and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
            return {"kind": PLURALS.get(plural, "") + "List", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)}, "items": items}


def _resources(groups) -> dict[str, dict]:
    """Discovery documents (APIResourceList per group version), as kubectl asks for them."""
    by_version = {"v1": ["configmaps", "services", "secrets", "pods", "persistentvolumeclaims"],
                  "batch/v1": ["jobs"], "kubeflow.org/v1": ["pytorchjobs"],
                  "trainer.kubeflow.org/v1alpha1": ["trainjobs"]}
    out = {}
    for version, plurals in by_version.items():
        if version != "v1" and version.split("/")[0] not in groups:
            continue
        out[version] = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": version,
                        "resources": [{"name": p, "singularName": PLURALS[p].lower(), "namespaced": True,
                                       "kind": PLURALS[p], "verbs": ["create", "delete", "get", "list",
                                                                     "patch", "update", "watch"]}
                                      for p in plurals]}
    return out


def _rfc3339nano(ns: int) -> str:
    """As the API writes times: nanoseconds with the fraction's trailing zeros trimmed."""
    fraction = f"{ns % 1_000_000_000:09d}".rstrip("0")
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + \
        (f".{fraction}" if fraction else "") + "Z"


def _node_of(pod: dict) -> int:
    labels = pod["metadata"]["labels"]
    if "batch.kubernetes.io/job-completion-index" in labels:
        return int(labels["batch.kubernetes.io/job-completion-index"])
    index = int(labels["training.kubeflow.org/replica-index"])
    return index + (1 if labels["training.kubeflow.org/replica-type"] == "worker" else 0)


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else "Success",
            "code": code, "reason": reason, "message": message}


def _handler(standin: Standin):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code: int, body, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            return url.path, _PATH.match(url.path), query

        def do_GET(self):
            path, match, query = self._route()
            if path == "/apis":
                groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                           "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
                          for g, v in (("batch", "v1"), ("kubeflow.org", "v1"),
                                       ("trainer.kubeflow.org", "v1alpha1")) if g in standin.groups]
                return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            if path == "/api":
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"],
                                        "serverAddressByClientCIDRs": []})
            served = _resources(standin.groups).get(path[len("/api/"):] if path.startswith("/api/")
                                                     else path[len("/apis/"):])
            if served is not None:
                return self._send(200, served)
            if not match:
                return self._send(404, _status(404, "NotFound", f"the server could not find {path}"))
            plural, ns, name = match["plural"], match["ns"], match["name"]
            if match["sub"] == "log":
                return self._log(ns, name, query)
            if name is None:
                if query.get("watch") in ("true", "1"):
                    return self._watch(plural, ns, query)
                return self._send(200, standin.list(plural, ns, query.get("labelSelector")))
            obj = standin.objects.get((plural, ns, name))
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            return self._send(200, obj)

        def _log(self, ns, name, query):
            pod = standin.objects.get(("pods", ns, name))
            if pod is None and (ns, name) not in standin.logs:
                return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
            if pod is not None and pod["status"]["phase"] == "Pending":
                container = pod["spec"]["containers"][0]["name"]
                return self._send(400, _status(400, "BadRequest", f'container "{container}" in pod '
                                                                  f'"{name}" is waiting to start: ContainerCreating'))
            if query.get("follow") not in ("true", "1"):
                body = standin.log_text(ns, name, query)
                with standin.lock:
                    standin.log_bytes_served[(ns, name)] = (standin.log_bytes_served.get((ns, name), 0)
                                                            + len(body.encode()))
                return self._send(200, body, "text/plain")
            # follow: stream what is there, then what comes, until the pod ends.
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            while True:
                with standin.lock:
                    text = standin.logs.get((ns, name), "")
                    pod = standin.objects.get(("pods", ns, name))
                    ended = pod is None or pod["status"]["phase"] in ("Succeeded", "Failed")
                    if len(text) == sent and not ended:
                        standin.lock.wait(1.0)
                        continue
                if len(text) > sent:
                    self._chunk(text[sent:].encode())
                    sent = len(text)
                if ended:
                    break
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _watch(self, plural, ns, query):
            since = int(query.get("resourceVersion") or 0)
            with standin.lock:
                oldest = standin.events[0][0] if standin.events else standin.rv
            if since and since < oldest - 1:
                return self._send(410, _status(410, "Expired", f"too old resource version: {since} ({oldest})"))
            selector = query.get("labelSelector")
            wanted = dict(p.split("=", 1) for p in selector.split(",")) if selector else {}
            deadline = time.monotonic() + float(query.get("timeoutSeconds") or 5)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            cursor = since
            while time.monotonic() < deadline:
                with standin.lock:
                    new = [e for e in standin.events if e[0] > cursor and e[1] == plural
                           and e[3]["metadata"]["namespace"] == ns]
                    if not new:
                        standin.lock.wait(0.5)
                        continue
                for rv, _, kind, obj in new:
                    cursor = rv
                    labels = obj["metadata"].get("labels", {})
                    if all(labels.get(k) == v for k, v in wanted.items()):
                        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            self._chunk(b"")

        def do_POST(self):
            _, match, _ = self._route()
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not match or match["name"]:
                return self._send(405, _status(405, "MethodNotAllowed", "POST a collection"))
            code, obj = standin.create(match["plural"], match["ns"], body)
            return self._send(code, obj)

        def do_DELETE(self):
            _, match, _ = self._route()
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            plural, ns, name = match["plural"], match["ns"], match["name"]
            current = standin.objects.get((plural, ns, name))
            kubelet = standin.kubelet
            if current is not None and current.get("kind") in WORKLOADS and kubelet is not None and \
                    any(kubelet.running(p["metadata"]["name"]) for p in standin.pods(name)):
                standin.deletes.append({"kind": current.get("kind"), "name": name, **body})
                kubelet.terminate(standin, plural, ns, name, body.get("gracePeriodSeconds"))
                return self._send(200, _status(200, "Success", "deleting"))
            obj = standin._remove(plural, ns, name)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            standin.deletes.append({"kind": obj.get("kind"), "name": name, **body})
            if obj.get("kind") in WORKLOADS and body.get("propagationPolicy") in ("Foreground", "Background"):
                for pod in standin.pods(name):  # garbage collection of the dependents
                    standin._remove("pods", ns, pod["metadata"]["name"])
            return self._send(200, _status(200, "Success", "deleted"))

    return Handler


POD_ENV = "DLC_STANDIN_POD"  # in every process of a pod the Kubelet runs: its "cgroup"


class Kubelet:
    """Runs a workload's pods as local processes (see the module's docstring)."""

    def __init__(self, root: str, pvc_dir: str):
        self.root, self.pvc_dir = root, pvc_dir
        self.procs: dict[str, subprocess.Popen] = {}  # pod name -> its container
        self.lock = threading.Lock()
        bin_dir = os.path.join(root, "bin")  # the image's `python`
        os.makedirs(bin_dir, exist_ok=True)
        if not os.path.exists(os.path.join(bin_dir, "python")):
            os.symlink(sys.executable, os.path.join(bin_dir, "python"))
        self.path = f"{bin_dir}:{os.environ['PATH']}"

    def start(self, standin: Standin, workload: dict) -> None:
        from labserver import free_port

        name, ns = workload["metadata"]["name"], workload["metadata"]["namespace"]
        spec = workload["spec"]
        if workload["kind"] == "TrainJob":
            command = spec["trainer"]["command"] + spec["trainer"].get("args", [])
        elif workload["kind"] == "PyTorchJob":
            container = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
            command = container["command"] + container.get("args", [])
        else:
            container = spec["template"]["spec"]["containers"][0]
            command = container["command"] + container.get("args", [])
        files = standin.objects.get(("configmaps", ns, f"{name}-files"), {}).get("data", {})
        secret = standin.objects.get(("secrets", ns, f"{name}-token"), {}).get("stringData", {})
        port = str(free_port())
        for pod in standin.pods(name):
            pod_name = pod["metadata"]["name"]
            here = os.path.join(self.root, pod_name)
            moved = {"/dlc/pvc": self.pvc_dir, "/dlc": os.path.join(here, "dlc"),
                     "/tmp/dlc-node.reporter": os.path.join(here, "reporter")}
            pattern = re.compile("|".join(map(re.escape, moved)))

            def in_pod(text: str, pattern=pattern, moved=moved) -> str:
                return pattern.sub(lambda m: moved[m.group(0)], text)

            os.makedirs(os.path.join(here, "dlc", "job"))
            for file, text in files.items():
                with open(os.path.join(here, "dlc", "job", file), "w") as f:
                    f.write(text)
            env = dict(os.environ, PATH=self.path, HOME=here, **{POD_ENV: pod_name})
            for item in pod["spec"]["containers"][0]["env"]:
                if "value" in item:
                    env[item["name"]] = in_pod(item["value"])
                elif "secretKeyRef" in item.get("valueFrom", {}):
                    env[item["name"]] = secret[item["valueFrom"]["secretKeyRef"]["key"]]
            for key in ("PET_MASTER_ADDR", "MASTER_ADDR"):
                if key in env:
                    env[key] = "127.0.0.1"
            for key in ("PET_MASTER_PORT", "MASTER_PORT"):
                if key in env:
                    env[key] = port
            proc = subprocess.Popen([in_pod(word) for word in command], env=env, cwd=here,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            with self.lock:
                self.procs[pod_name] = proc
            standin._pod_update(pod, "Running", containerStatuses=standin._container(
                pod, {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}),
                conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
            threading.Thread(target=self._follow, args=(standin, name, pod, proc), daemon=True).start()
        standin._conditions(name, "Running")

    def _follow(self, standin: Standin, workload: str, pod: dict, proc: subprocess.Popen) -> None:
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        assert proc.stdout is not None
        for line in proc.stdout:
            standin.write_log(ns, pod_name, line.decode(errors="replace"))
        code = proc.wait()
        code = code if code >= 0 else 128 - code  # a signal, as a container's exit code
        self._kill_pod(pod_name)  # the container ends with its main process: all of it goes
        with standin.lock:
            current = standin.objects.get(("pods", ns, pod_name))
            if current is None:
                return
            if current["metadata"].get("deletionTimestamp"):  # terminating: now it is gone
                standin._remove("pods", ns, pod_name)
                self._remove_deleted_workload(standin, ns, workload)
                return
        standin._terminate(current, code, "Completed" if code == 0 else "Error")
        with standin.lock:
            pods = standin.pods(workload)
            ended = [p for p in pods if p["status"]["phase"] in ("Succeeded", "Failed")]
        if len(ended) == len(pods):
            failed = any(p["status"]["phase"] == "Failed" for p in pods)
            standin._conditions(workload, "Failed" if failed else "Succeeded")

    @staticmethod
    def _remove_deleted_workload(standin: Standin, ns: str, workload: str) -> None:
        """A workload deleted in the foreground goes once its last pod has."""
        if standin.pods(workload):
            return
        for (plural, n, name), obj in list(standin.objects.items()):
            if n == ns and name == workload and obj.get("kind") in WORKLOADS:
                standin._remove(plural, ns, name)

    def running(self, pod_name: str) -> bool:
        with self.lock:
            proc = self.procs.get(pod_name)
        return proc is not None and proc.poll() is None

    def terminate(self, standin: Standin, plural: str, ns: str, workload: str, grace: int | None) -> None:
        """A foreground delete of a workload whose pods run: they are marked terminating and
        stay until their containers have exited (SIGTERM, SIGKILL after the grace), then
        the workload goes, as a real cluster's garbage collector does."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for pod in standin.pods(workload):
            name = pod["metadata"]["name"]
            if not self.running(name):
                standin._remove("pods", ns, name)
                continue
            if not pod["metadata"].get("deletionTimestamp"):
                marked = json.loads(json.dumps(pod))
                marked["metadata"]["deletionTimestamp"] = when
                standin._put("pods", marked, "MODIFIED")
            self.stop(name, grace)
        obj = standin.objects.get((plural, ns, workload))
        if obj is not None and not obj["metadata"].get("deletionTimestamp"):
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["deletionTimestamp"] = when
            standin._put(plural, obj, "MODIFIED")
        self._remove_deleted_workload(standin, ns, workload)

    def stop(self, pod_name: str, grace: int | None) -> None:
        """SIGTERM to the container's main process, every process of the pod SIGKILLed once
        its grace is over (the kubelet's and the container runtime's way)."""
        with self.lock:
            proc = self.procs.get(pod_name)
        if proc is None or proc.poll() is not None:
            return
        if not grace:
            self._kill_pod(pod_name)
            return
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        threading.Timer(grace, self._kill_pod, args=(pod_name,)).start()

    @staticmethod
    def _kill_pod(pod_name: str) -> None:
        """Every process of the pod (they carry its name in their environment, as a
        container's processes share its cgroup), SIGKILLed."""
        marker = f"{POD_ENV}={pod_name}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            procs = dict(self.procs)
        for name, proc in procs.items():
            self._kill_pod(name)
            proc.wait()
