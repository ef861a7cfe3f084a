"""`jupyter-dlc launcher manifest`: the launcher as a Deployment in one namespace.

Printed: ServiceAccount, Role + RoleBinding (least privilege: only what the engine creates,
reads and deletes, plus pods and pods/log, in this namespace), the ReadWriteMany PVC, a
ConfigMap with an in-cluster cluster profile, the Deployment and its Service. The token is
not in the output: the Deployment reads it from a Secret the user creates (the first
comment says how), so the manifest can be committed and shared.
"""

from __future__ import annotations

from typing import Any

import yaml

from . import manifests as k8s_manifests

NAME = "jupyter-dlc"
PORT = 8787
TOKEN_SECRET = "jupyter-dlc-token"

# What the engine touches: the workloads of every kind it can create, the per-attempt
# ConfigMap, Service and token Secret, and pods (status) and their logs. Nothing else.
RULES = [
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
     "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
     "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["services", "configmaps", "secrets"],
     "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def launcher_manifests(namespace: str = "default", image: str = "ghcr.io/OWNER/jupyter-dlc:latest",
                       pvc: str = "dlc-checkpoints", pvc_size: str = "100Gi",
                       job_image: str | None = None) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": k8s_manifests.MANAGED_BY}
    meta = {"name": NAME, "namespace": namespace, "labels": labels}
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    profile = {"clusters": {"in-cluster": {
        "engine": "kubernetes", "namespace": namespace, "pvc": pvc, "launcher_url": url,
        "launcher_pvc_dir": k8s_manifests.PVC_DIR,
        "image": job_image or k8s_manifests.DEFAULT_IMAGE}}}
    data_dir = f"{k8s_manifests.PVC_DIR}/launcher"
    container = {
        "name": "launcher", "image": image,
        "command": ["python", "-m", "jupyter_dlc.launcher", "--host", "0.0.0.0", "--port", str(PORT),
                    "--data-dir", data_dir],
        "env": [{"name": "DLC_LAUNCHER_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": TOKEN_SECRET, "key": "token"}}},
                {"name": "DLC_CLUSTERS", "value": "/etc/jupyter-dlc/dlc_clusters.yaml"}],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 5},
        "volumeMounts": [{"name": "data", "mountPath": k8s_manifests.PVC_DIR},
                         {"name": "profiles", "mountPath": "/etc/jupyter-dlc", "readOnly": True}]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        k8s_manifests.pvc(pvc, namespace, pvc_size),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(meta, name=f"{NAME}-profiles"),
         "data": {"dlc_clusters.yaml": yaml.safe_dump(profile, sort_keys=False)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
            # One launcher per data directory (it holds a lock there): never two at once.
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": NAME, "containers": [container],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc}},
                            {"name": "profiles", "configMap": {"name": f"{NAME}-profiles"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
            "selector": {"app.kubernetes.io/name": NAME},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}},
    ]


def render(namespace: str = "default", **kwargs) -> str:
    """The manifests as one YAML stream, with the steps that are not in it as comments."""
    head = (f"# jupyter-dlc launcher in namespace {namespace!r}. First create its token (not in\n"
            f"# this file):\n#   kubectl -n {namespace} create secret generic {TOKEN_SECRET} "
            "--from-literal=token=\"$(openssl rand -hex 24)\"\n"
            "# then: kubectl apply -f this.yaml. Notebook servers (JupyterHub) connect with\n"
            f"#   DLC_LAUNCHER_URL=http://{NAME}.{namespace}.svc:{PORT} and DLC_LAUNCHER_TOKEN from "
            "the Secret.\n")
    docs = launcher_manifests(namespace, **kwargs)
    return head + "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
