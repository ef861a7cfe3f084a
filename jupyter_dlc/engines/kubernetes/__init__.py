"""The Kubernetes engine: one TrainJob, PyTorchJob or Indexed Job per attempt (engine.py),
its manifests (manifests.py, pure dicts), its API client (api.py), its pods' logs (logs.py),
and the manifests that run the launcher itself in a cluster (launcher_manifests.py, for the
CLI's `jupyter-dlc k8s-launcher`)."""

from .engine import KubernetesEngine

__all__ = ["KubernetesEngine"]
