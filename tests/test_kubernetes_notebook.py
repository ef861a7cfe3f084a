"""examples/kubernetes.ipynb, executed by a real kernel (nbclient) with a real launcher, against
the API stand-in of tests/k8s_standin.py that the notebook starts itself (no cluster can run
here). A real cluster would run the cell's ranks in the pods; there the notebook skips the
stand-in cell and uses a profile for the user's kubectl context."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def profiles_then_launcher(tmp_path, monkeypatch):
    """DLC_CLUSTERS first, so the launcher (and the kernel) read the profile the notebook writes."""
    from conftest import LauncherEnv

    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    monkeypatch.setenv("DLC_REPO", ROOT)
    env = LauncherEnv(str(tmp_path / "launcher"))
    yield env
    env.close()


def test_the_kubernetes_example_notebook_runs(profiles_then_launcher, tmp_path):
    pytest.importorskip("kubernetes")
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(ROOT, "examples", "kubernetes.ipynb"), as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(out.get("text", "") + "".join(out.get("data", {}).get("text/plain", ""))
                     for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "serves TrainJob, PyTorchJob, Job" in text, text[-3000:]
    assert "PENDING - waiting in kubernetes: 2 of 2 pod(s) pending" in text
    assert "created: TrainJob/dlc-k8s-demo-" in text
    assert "rank 1: node 1 line 0" in text
    assert "FAILED - OOMKilled: node 1" in text
    assert text.count("OOMKilled: node 1") >= 2  # the state line and `why`
    assert "03-job.yaml" in text and "kind: Job" in text
