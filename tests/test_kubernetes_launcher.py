"""`jupyter-dlc launcher manifest`: the launcher in the cluster. The manifests are validated
strictly with kubernetes-validate (no API server here: a real cluster would also check that
the image exists, that RBAC lets the ServiceAccount do what the engine asks, and that the
storage class serves ReadWriteMany). The launcher options the Deployment uses (--host, the token
from the Secret's variable) and a notebook server's connection by URL and token run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from conftest import wait_for
from k8s_validate import validate

from jupyter_dlc.cli import main
from jupyter_dlc.client import LauncherClient
from jupyter_dlc.engines.kubernetes.manifests import MANAGED_BY


def _manifest(capsys, *args) -> tuple[str, list[dict]]:
    assert main(["launcher", "manifest", *args]) == 0
    text = capsys.readouterr().out
    return text, [d for d in yaml.safe_load_all(text) if d]


def test_manifest_is_valid_least_privilege_and_keeps_the_token_out(capsys):
    text, docs = _manifest(capsys, "--namespace", "ml", "--image", "ghcr.io/me/dlc:1")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Role", "RoleBinding",
                     "Service", "ServiceAccount"]
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["namespace"] == "ml"
    assert "kind: Secret" not in text and "create secret generic jupyter-dlc-token" in text
    found = {d["kind"]: d for d in docs}
    # Least privilege: a namespaced Role, no wildcards, pods only read, nothing beyond what the
    # engine creates.
    rules = found["Role"]["rules"]
    resources = sorted(r for rule in rules for r in rule["resources"])
    assert resources == ["configmaps", "jobs", "podgroups", "pods", "pods/log", "pytorchjobs",
                         "secrets", "services", "trainjobs"]
    assert not [rule for rule in rules if "*" in rule["verbs"] + rule["resources"] + rule["apiGroups"]]
    verbs = {r: rule["verbs"] for rule in rules for r in rule["resources"]}
    assert verbs["pods"] == ["get", "list", "watch"] and verbs["pods/log"] == ["get"]
    assert found["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "jupyter-dlc",
                                                 "namespace": "ml"}]
    pod = found["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "jupyter-dlc"
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/me/dlc:1"
    token = next(e for e in container["env"] if e["name"] == "DLC_LAUNCHER_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "jupyter-dlc-token", "key": "token"}
    assert found["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    # The in-cluster profile the launcher reads: pods reach it through the Service.
    profile = yaml.safe_load(found["ConfigMap"]["data"]["dlc_clusters.yaml"])["clusters"]["in-cluster"]
    assert profile["launcher_url"] == "http://jupyter-dlc.ml.svc:8787"
    assert found["Service"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY


def test_the_launcher_as_the_deployment_runs_it_and_a_notebook_server_connects(tmp_path, monkeypatch):
    """The Deployment's command, on loopback: every address, the token from the environment;
    then a client configured only by DLC_LAUNCHER_URL/DLC_LAUNCHER_TOKEN (as on JupyterHub)."""
    conn = tmp_path / "conn.json"
    env = dict(os.environ, DLC_LAUNCHER_TOKEN="token-from-the-secret")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_dlc.launcher", "--host", "0.0.0.0",
                             "--data-dir", str(tmp_path / "data"), "--connection-file", str(conn)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: conn.exists() or proc.poll() is not None, what="the launcher's connection file")
        info = json.loads(conn.read_text())
        assert info["token"] == "token-from-the-secret"
        port = info["url"].rsplit(":", 1)[1]
        monkeypatch.setenv("DLC_LAUNCHER_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("DLC_LAUNCHER_TOKEN", "token-from-the-secret")
        client = LauncherClient.connect(start=False)
        assert client.alive() and client.jobs() == []
        monkeypatch.setenv("DLC_LAUNCHER_TOKEN", "wrong")
        assert not LauncherClient.connect(start=False).alive()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
