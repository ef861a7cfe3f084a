"""The Kubernetes API through the official client's ApiClient: kubeconfig (the profile's
`kubeconfig` and `context`, else ~/.kube/config) or in-cluster credentials. One generic
request per verb, on JSON dicts, so custom resources and core types go the same way."""

from __future__ import annotations

import json
import os
from typing import Any

CORE_KINDS = {"ConfigMap": "configmaps", "Service": "services", "Secret": "secrets",
              "Pod": "pods", "PersistentVolumeClaim": "persistentvolumeclaims"}
PLURALS = dict(CORE_KINDS, Job="jobs", PyTorchJob="pytorchjobs", TrainJob="trainjobs",
               PodGroup="podgroups")


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


def collection(api_version: str, kind: str, namespace: str) -> str:
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{PLURALS[kind]}"


class Api:
    def __init__(self, profile):
        from kubernetes import client, config

        configuration = client.Configuration()
        if not profile.get("kubeconfig") and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=profile.get("kubeconfig"), context=profile.get("context"),
                                    client_configuration=configuration)
        self.client = client.ApiClient(configuration)

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None,
                text: bool = False) -> Any:
        """One call; the client adds the credentials (bearer token, client certificate)."""
        method, url, headers, payload, post = self.client.param_serialize(
            method, path, query_params=list((query or {}).items()), body=body,
            header_params={"Content-Type": "application/json",
                           "Accept": "text/plain" if text else "application/json"},
            auth_settings=["BearerToken"])
        response = self.client.call_api(method, url, headers, payload, post, _request_timeout=30)
        data = response.read().decode(errors="replace")
        if not 200 <= response.status < 300:
            try:
                message = json.loads(data).get("message") or data
            except ValueError:
                message = data or str(response.status)
            raise ApiError(response.status, message)
        return data if text else json.loads(data or "{}")

    def create(self, manifest: dict) -> dict:
        meta = manifest["metadata"]
        return self.request("POST", collection(manifest["apiVersion"], manifest["kind"], meta["namespace"]),
                            manifest)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"{collection(api_version, kind, namespace)}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[dict]:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())}
        return self.request("GET", collection(api_version, kind, namespace), query=query)["items"]

    def delete(self, api_version: str, kind: str, namespace: str, name: str, grace: int | None = None) -> bool:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
        if grace is not None:
            body["gracePeriodSeconds"] = int(grace)
        try:
            self.request("DELETE", f"{collection(api_version, kind, namespace)}/{name}", body)
            return True
        except ApiError as error:
            if error.status == 404:
                return False
            raise

    def pod_log(self, namespace: str, pod: str, since_time: str | None = None,
                timestamps: bool = False) -> str:
        query = {"timestamps": "true"} if timestamps else {}
        if since_time:
            query["sinceTime"] = since_time
        return self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query=query,
                            text=True)

    def groups(self) -> set[str]:
        return {g["name"] for g in self.request("GET", "/apis").get("groups", [])}
