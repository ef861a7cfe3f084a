"""Validate Kubernetes manifests offline, strictly: custom resources against the official CRDs
copied into ../shared/k8s (relative to the repository root), core types with the
`kubernetes-validate` package. An unknown field fails in both."""

from __future__ import annotations

import copy
import os
from functools import cache

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ../shared/k8s next to the checkout (CI, /work/main); a worktree one level deeper looks one up.
_CANDIDATES = [os.path.join(os.path.dirname(REPO), "shared", "k8s"),
               os.path.join(os.path.dirname(os.path.dirname(REPO)), "shared", "k8s")]
CRD_DIR = os.environ.get("DLC_K8S_CRDS") or next(
    (path for path in _CANDIDATES if os.path.isdir(path)), _CANDIDATES[0])
CRD_FILES = {("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
             ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml"}
K8S_VERSION = "1.32.0"  # the kubectl on this machine


def require_crds() -> None:
    if not os.path.isfile(os.path.join(CRD_DIR, CRD_FILES[("kubeflow.org/v1", "PyTorchJob")])):
        pytest.skip(f"the official CRDs are not at {CRD_DIR} (../shared/k8s next to the checkout, "
                    "or DLC_K8S_CRDS); strict validation of custom resources needs them")


def _strict(schema):
    """additionalProperties: false wherever the CRD lists properties and does not preserve
    unknown fields, so a misspelt field fails (the API server prunes or rejects it)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (schema.get("type") == "object" and "properties" in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")
                and "additionalProperties" not in schema):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@cache
def crd_schema(api_version: str, kind: str) -> dict:
    with open(os.path.join(CRD_DIR, CRD_FILES[(api_version, kind)])) as f:
        crd = yaml.safe_load(f)
    version = api_version.split("/")[1]
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = copy.deepcopy(entry["schema"]["openAPIV3Schema"])
            # apiVersion/kind/metadata are checked by the API server itself.
            schema["properties"]["metadata"] = {"type": "object"}
            return _strict(schema)
    raise KeyError(api_version)


def validate(manifest: dict) -> None:
    """Raise on any schema error; skip (pytest) for custom resources without their CRD here."""
    import jsonschema

    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key in CRD_FILES:
        require_crds()
        jsonschema.validate(manifest, crd_schema(*key))
    elif key[0] in ("v1", "batch/v1", "apps/v1", "rbac.authorization.k8s.io/v1"):
        import kubernetes_validate

        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    else:
        raise AssertionError(f"no schema to validate {key} against")
