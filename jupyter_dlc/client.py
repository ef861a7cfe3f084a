"""The one HTTP client of the launcher; finds it through its connection file or starts it.

Stdlib only (urllib): it runs in kernels, the CLI and the server extension.
"""

from __future__ import annotations

import fcntl
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

from . import paths, wirejson
from .spec import JobSpec, resolve_paths
from .states import TERMINAL_STATES as TERMINAL


class LauncherError(RuntimeError):
    """The launcher answered with an error (its one-line message) or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class LauncherUnavailable(LauncherError):
    pass


class LauncherClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0, ca_file: str | None = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # An https launcher's certificate is trusted through this CA file (its own, when
        # self-signed); None: the system's CAs.
        self.ca_file = ca_file
        self._tls = ssl.create_default_context(cafile=ca_file) if ca_file else None

    # -- finding or starting the launcher ---------------------------------------------------
    @classmethod
    def from_connection_file(cls, path: str | None = None) -> LauncherClient | None:
        try:
            with open(path or paths.connection_file()) as f:
                info = json.load(f)
            return cls(info["url"], info["token"], ca_file=info.get("ca_file"))
        except (OSError, ValueError, KeyError):
            return None

    @classmethod
    def connect(cls, start: bool = True, timeout: float = 30.0) -> LauncherClient:
        if os.environ.get("DLC_LAUNCHER_URL") and os.environ.get("DLC_LAUNCHER_TOKEN"):
            # A launcher elsewhere (in the cluster, `jupyter-dlc launcher manifest`): never start one.
            return cls(os.environ["DLC_LAUNCHER_URL"], os.environ["DLC_LAUNCHER_TOKEN"],
                       ca_file=os.environ.get("DLC_LAUNCHER_CA"))
        client = cls.from_connection_file()
        if client is not None and client.alive():
            return client
        if not start:
            raise LauncherUnavailable("launcher: not running; start it with `jupyter-dlc launcher start`")
        os.makedirs(paths.runtime_dir(), exist_ok=True)
        # Two kernels starting at once must not start two launchers: one waits for the other.
        with open(os.path.join(paths.runtime_dir(), "jupyter-dlc-launcher.start.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            client = cls.from_connection_file()
            if client is not None and client.alive():
                return client
            proc = start_launcher()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                client = cls.from_connection_file()
                if client is not None and client.alive():
                    return client
                if proc.poll() is not None and proc.returncode != 3:  # 3: another one serves
                    break
                time.sleep(0.05)
        log = os.path.join(paths.data_dir(), "launcher.log")
        raise LauncherUnavailable(f"launcher: did not start within {timeout:g}s; see {log}")

    def alive(self) -> bool:
        try:
            return bool(self.request("GET", "/healthz", timeout=2)[1].get("ok"))
        except LauncherError:
            return False

    # -- HTTP ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                timeout: float | None = None) -> tuple[int, dict]:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        url = self.url + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self._tls) as resp:
                raw = resp.read()
                return resp.status, (wirejson.loads(raw) if raw else {})
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                message = json.loads(raw).get("error") or raw.decode()
            except ValueError:
                message = raw.decode(errors="replace") or str(error)
            raise LauncherError(message, error.code) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
            raise LauncherUnavailable(f"launcher: unreachable at {self.url} ({error})") from None

    def _get(self, path: str, **params: Any) -> dict:
        return self.request("GET", path, params=params)[1]

    def _post(self, path: str, body: dict | None = None) -> dict:
        return self.request("POST", path, body=body or {})[1]

    # -- the API ------------------------------------------------------------------------
    def submit(self, spec: JobSpec | dict) -> dict:
        # Relative paths mean the caller's directory, which only this side knows.
        data = resolve_paths(spec.to_dict() if isinstance(spec, JobSpec) else dict(spec))
        if isinstance(spec, dict):
            JobSpec.from_dict(dict(data))  # the same one-line errors before the round trip
        return self._post("/api/jobs", data)

    def jobs(self) -> list[dict]:
        return self._get("/api/jobs")["jobs"]

    def job(self, job_id: str, rank_sort: str | None = None, rank_page: int | None = None,
            rank_page_size: int | None = None) -> dict:
        """A job's detail: every rank, or with `rank_sort`/`rank_page` one page of them (in
        "rank", "step" (slowest first) or "heartbeat" (oldest first) order) and `rank_page`."""
        return self._get(f"/api/jobs/{job_id}", rank_sort=rank_sort, rank_page=rank_page,
                         rank_page_size=rank_page_size)

    def stop(self, job_id: str, grace: float | None = None, timeout: float | None = None) -> dict:
        """Stop a job; returns it once the stop is recorded (STOPPING, or STOPPED for a job
        that had not started). The launcher answers 202 at once; a stop that waits there for
        the job's submit to return (a slow sbatch) is waited for here, up to `timeout`."""
        job = self._post(f"/api/jobs/{job_id}/stop", {"grace": grace} if grace is not None else {})
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while job["state"] != "STOPPING" and job["state"] not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.1)
            job = self.job(job["id"])
        return job

    def resume(self, job_id: str, step: int | None = None) -> dict:
        return self._post(f"/api/jobs/{job_id}/resume", {"step": step} if step is not None else {})

    def clone(self, job_id: str) -> dict:
        return self._post(f"/api/jobs/{job_id}/clone")

    def delete(self, job_id: str) -> None:
        self.request("DELETE", f"/api/jobs/{job_id}")

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None,
             cursor: str | None = None, attempt: int | None = None) -> dict:
        return self._get(f"/api/jobs/{job_id}/logs", rank=rank, tail=tail, cursor=cursor,
                         attempt=attempt)

    def metrics_stream(self, job_id: str, since: int = 0, timeout: float = 30.0,
                       band: Iterable[int] | None = None) -> Iterator[tuple[str, dict]]:
        """A job's metric points pushed as they are stored (`metrics` events), and its summary
        when it changes (`job`); the launcher pings every few seconds, so `timeout` bounds
        how long a dead connection goes unnoticed. `band`: as for `metrics`."""
        return self.stream(timeout, f"/api/jobs/{urllib.parse.quote(job_id)}/metrics/stream",
                           {"since": since, **_band_params(band)}, comments=True)

    def metrics(self, job_id: str, since: int = 0, band: Iterable[int] | None = None) -> dict:
        """The next page of points after `since`. With `band` (the ranks drawn as lines of
        their own, jupyter_dlc/bands.py), a job past 8 ranks answers the other ranks' train
        points folded per step, in `bands`."""
        return self._get(f"/api/jobs/{job_id}/metrics", since=since, **_band_params(band))

    def events(self, job_id: str, since: int = 0) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/events", since=since)["events"]

    def checkpoints(self, job_id: str) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/checkpoints")["checkpoints"]

    def diagnosis(self, job_id: str) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/diagnosis")["diagnoses"]

    def alerts(self, job_id: str) -> dict:
        return self._get(f"/api/jobs/{job_id}/alerts")

    def script(self, job_id: str) -> dict:
        return self._get(f"/api/jobs/{job_id}/script")

    def pools(self) -> list[dict]:
        return self._get("/api/pools")["pools"]

    def pool_up(self, nodes: int, nproc_per_node: int, cluster: str | None = None,
                idle_timeout: float | None = None) -> dict:
        body = {"nodes": nodes, "nproc_per_node": nproc_per_node, "cluster": cluster,
                "idle_timeout": idle_timeout}
        return self._post("/api/pools", {k: v for k, v in body.items() if v is not None})

    def pool_down(self, nodes: int | None = None, nproc_per_node: int | None = None,
                  cluster: str | None = None) -> list[str]:
        body = {"nodes": nodes, "nproc_per_node": nproc_per_node, "cluster": cluster}
        return self._post("/api/pools/down", {k: v for k, v in body.items() if v is not None})["released"]

    def release_pool(self, pool_id: str) -> list[str]:
        return self.request("DELETE", f"/api/pools/{pool_id}")[1]["released"]

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.5) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout:g}s")
            time.sleep(poll)

    def stream(self, timeout: float = 60.0, path: str = "/api/stream", params: dict | None = None,
               comments: bool = False) -> Iterator[tuple[str, dict]]:
        """(event, data) pairs from one of the launcher's server-sent event routes; with
        `comments`, also ("comment", {}) for each keep-alive line, so that a reader gets
        control back while nothing happens."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        req = urllib.request.Request(self.url + path + query,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            resp = urllib.request.urlopen(req, timeout=timeout, context=self._tls)
        except urllib.error.HTTPError as error:
            raise LauncherError(f"stream: {error.code}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            raise LauncherUnavailable(f"launcher: unreachable at {self.url} ({error})") from None
        with resp:
            event, data = "message", []
            for raw in resp:
                line = raw.decode().rstrip("\n")
                if not line:
                    if data:
                        yield event, wirejson.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith(":") and comments:
                    yield "comment", {}
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())


def start_launcher() -> subprocess.Popen:
    """Start a detached launcher (own session, so it outlives this kernel or shell)."""
    data_dir = paths.data_dir()
    os.makedirs(data_dir, exist_ok=True)
    log = open(os.path.join(data_dir, "launcher.log"), "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "jupyter_dlc.launcher", "--data-dir", data_dir,
                                 "--connection-file", paths.connection_file()],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    finally:
        log.close()


def _band_params(band: Iterable[int] | None) -> dict:
    return {} if band is None else {"band": 1, "ranks": ",".join(str(rank) for rank in sorted(band))}
