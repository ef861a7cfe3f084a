"""`export` writes k8s/ for every job, whichever engine ran it, valid as written: each file is one
manifest validated strictly (CRDs from ../shared/k8s, core types with kubernetes-validate).
`kubectl apply --dry-run=client` needs an API server for discovery even in client mode (kubectl
1.32: "failed to download openapi"); the real kubectl applies the bundle to the API stand-in
instead. A real cluster would also run admission (Kueue, Volcano, the operators' webhooks)."""

from __future__ import annotations

import base64
import os

import pytest
import yaml
from k8s_validate import validate

from jupyter_dlc import clusters
from jupyter_dlc.export import export_bundle
from jupyter_dlc.spec import JobSpec


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))


def _export(tmp_path, spec: JobSpec, pushed: dict[str, bytes] | None = None):
    staged = {}
    for name, data in (pushed or {}).items():
        path = tmp_path / f"staged-{name}"
        path.write_bytes(data)
        staged[name] = str(path)
    dest = tmp_path / "bundle"
    export_bundle(spec, "print('hi')\n", str(dest), files=staged)
    found = {}
    for name in sorted(os.listdir(dest / "k8s")):
        text = (dest / "k8s" / name).read_text()
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 1, name
        found[docs[0]["kind"]] = (docs[0], text)
    return found


def test_a_local_job_exports_an_indexed_job_with_defaults_to_edit(profiles, tmp_path):
    spec = JobSpec(name="Local.Train_1", code="x", nodes=2, nproc_per_node=2, env={"A": "1"})
    spec.validate()
    found = _export(tmp_path, spec, {"DATA.pt": b"\x80binary"})
    assert sorted(found) == ["ConfigMap", "Job", "PersistentVolumeClaim", "Service"]
    for manifest, text in found.values():
        validate(manifest)
        assert manifest["metadata"]["namespace"] == "default"
        assert "DLC_TOKEN" not in text and "DLC_LAUNCHER_URL" not in text
        assert "Defaults to edit: namespace 'default', image" in text
    job = found["Job"][0]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("pytorch/pytorch:")
    assert "jupyter_dlc.runtime.bootstrap" not in container["command"][2]  # plain torchrun
    assert {"name": "A", "value": "1"} in container["env"]
    assert base64.b64decode(found["ConfigMap"][0]["binaryData"]["DATA.pt"]) == b"\x80binary"
    assert found["ConfigMap"][0]["data"]["script.py"] == "print('hi')\n"


def test_a_job_with_a_kubernetes_profile_exports_its_kind_and_options(profiles, tmp_path):
    clusters.put_profile("my-k8s", {"engine": "kubernetes", "kind": "PyTorchJob", "namespace": "ml",
                                    "image": "ghcr.io/me/t:2", "pvc": "team"})
    spec = JobSpec(name="t", code="x", nodes=2, nproc_per_node=1, cluster="my-k8s", engine="kubernetes")
    spec.validate()
    found = _export(tmp_path, spec)
    assert sorted(found) == ["ConfigMap", "PersistentVolumeClaim", "PyTorchJob"]
    for manifest, text in found.values():
        validate(manifest)
        assert manifest["metadata"]["namespace"] == "ml" and "Defaults to edit" not in text
    assert found["PersistentVolumeClaim"][0]["metadata"]["name"] == "team"
    master = found["PyTorchJob"][0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["image"] == "ghcr.io/me/t:2"


def test_a_slurm_job_exports_defaults_and_big_files_go_on_the_pvc(profiles, tmp_path):
    clusters.put_profile("hpc", {"engine": "slurm", "partition": "a100"})
    spec = JobSpec(name="s", code="x", nodes=1, cluster="hpc", engine="slurm")
    spec.validate()
    found = _export(tmp_path, spec, {"big.bin": b"0" * (1024 * 1024)})
    assert "ConfigMap" not in found
    job, text = found["Job"]
    validate(job)
    assert job["metadata"]["namespace"] == "default"
    assert "too big for a ConfigMap: copy them to the PVC at jobs/dlc-s-a1/" in text


@pytest.mark.parametrize("kind", ["Job", "TrainJob"])
def test_kubectl_apply_creates_the_exported_bundle_on_the_standin(profiles, tmp_path, kind):
    """`kubectl apply -f k8s/` (the real kubectl 1.32) against the API stand-in of
    tests/k8s_standin.py: every file maps to a served kind and is created, and the stand-in's
    operator makes the pods. kubectl's client-side validation needs the server's OpenAPI,
    which the stand-in does not serve (--validate=false; the schemas are checked above); a
    real cluster would also validate server-side and admit the pods."""
    import shutil
    import subprocess

    from k8s_standin import Standin

    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed")
    if kind == "TrainJob":
        clusters.put_profile("k", {"engine": "kubernetes", "kind": "TrainJob", "namespace": "ml"})
    spec = JobSpec(name="applied", code="x", nodes=2, cluster="k" if kind == "TrainJob" else None,
                   engine="kubernetes" if kind == "TrainJob" else "local")
    spec.validate()
    _export(tmp_path, spec)
    with Standin(groups=("trainer.kubeflow.org",)) as standin:
        config = standin.kubeconfig(str(tmp_path / "kubeconfig"))
        result = subprocess.run(["kubectl", "--kubeconfig", config, "apply", "--validate=false",
                                 "-f", str(tmp_path / "bundle" / "k8s")],
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count(" created") == len(os.listdir(tmp_path / "bundle" / "k8s"))
        plural = "trainjobs" if kind == "TrainJob" else "jobs"
        namespace = "ml" if kind == "TrainJob" else "default"
        assert (plural, namespace, "dlc-applied-a1") in standin.objects
        assert ("configmaps", namespace, "dlc-applied-a1-files") in standin.objects
        assert len(standin.pods("dlc-applied-a1")) == 2
