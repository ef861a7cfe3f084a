"""The one HTTP client of the launcher; finds it through its connection file or starts it.

Stdlib only (urllib): it runs in kernels, the CLI and the server extension.
"""

from __future__ import annotations

import fcntl
import http.client
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

from . import identity, paths, wirejson
from .spec import JobSpec, resolve_paths
from .states import TERMINAL_STATES as TERMINAL


class LauncherError(RuntimeError):
    """The launcher answered with an error (its one-line message) or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class LauncherUnavailable(LauncherError):
    pass


class NotTheLauncher(LauncherUnavailable):
    """Something answers on the launcher's port but cannot prove it is the launcher."""


# What `identify` finds at the launcher's address. STALE: this data dir's launcher, but
# another run of it than the connection file's (it is about to write its own).
PROVEN, GONE, IMPOSTOR, STALE = "proven", "gone", "impostor", "stale"


# How long the data dir's own launcher may stay silent before a client says it is frozen:
# longer than a busy launcher's pause, far shorter than a start's 30 s.
FROZEN_AFTER = 8.0


class LauncherClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0, ca_file: str | None = None,
                 identity_key: str | None = None, pid: int | None = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # An https launcher's certificate is trusted through this CA file (its own, when
        # self-signed); None: the system's CAs.
        self.ca_file = ca_file
        self._tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
        # The key the launcher's /healthz proves (identity.py), from its connection file;
        # None (a launcher given by URL and token alone): nothing is checked but TLS.
        self.identity_key = identity_key
        self.pid = pid  # the launcher's, as its connection file says

    # -- finding or starting the launcher ---------------------------------------------------
    @classmethod
    def from_connection_file(cls, path: str | None = None) -> LauncherClient | None:
        try:
            with open(path or paths.connection_file()) as f:
                info = json.load(f)
            return cls(info["url"], info["token"], ca_file=info.get("ca_file"),
                       identity_key=info.get("identity"), pid=info.get("pid"))
        except (OSError, ValueError, KeyError):
            return None

    @classmethod
    def connect(cls, start: bool = True, timeout: float = 30.0) -> LauncherClient:
        if os.environ.get("DLC_LAUNCHER_URL") and os.environ.get("DLC_LAUNCHER_TOKEN"):
            # A launcher elsewhere (in the cluster, `jupyter-dlc launcher manifest`): never start one.
            return cls(os.environ["DLC_LAUNCHER_URL"], os.environ["DLC_LAUNCHER_TOKEN"],
                       ca_file=os.environ.get("DLC_LAUNCHER_CA"),
                       identity_key=os.environ.get("DLC_LAUNCHER_IDENTITY") or None)
        found = cls.find(timeout)
        if found is not None:
            return found
        if not start:
            raise LauncherUnavailable("launcher: not running; start it with `jupyter-dlc launcher start`")
        os.makedirs(paths.runtime_dir(), exist_ok=True)
        # Two kernels starting at once must not start two launchers: one waits for the other.
        with open(os.path.join(paths.runtime_dir(), "jupyter-dlc-launcher.start.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = cls.find(timeout)
            if found is not None:
                return found
            proc = start_launcher()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                client = cls.from_connection_file()
                if client is not None and client.alive():
                    return client
                if proc.poll() is not None:
                    if proc.returncode == 3:  # another one serves: which, and why not here
                        return cls.find(timeout) or cls._not_started(timeout)
                    break
                time.sleep(0.05)
        return cls._not_started(timeout)

    @classmethod
    def _not_started(cls, timeout: float) -> LauncherClient:
        log = os.path.join(paths.data_dir(), "launcher.log")
        raise LauncherUnavailable(f"launcher: did not start within {timeout:g}s; see {log}")

    @classmethod
    def find(cls, timeout: float = 30.0) -> LauncherClient | None:
        """The data dir's launcher when it answers and proves itself; None when no launcher
        holds the data dir. Raises, with what to do in one line, when something else answers
        on its port, or a launcher holds the data dir but cannot be used from here."""
        deadline = time.monotonic() + timeout
        silent_since: float | None = None  # when the data dir's own launcher first did not answer
        while True:
            client = cls.from_connection_file()
            verdict = client.identify() if client is not None else GONE
            if client is not None and verdict == PROVEN:
                return client
            if client is not None and verdict == IMPOSTOR:
                raise NotTheLauncher(client.impostor_message())
            holder = lock_holder(paths.data_dir())
            if holder is None:
                return None
            data, pid = paths.data_dir(), holder.get("pid")
            theirs = holder.get("connection_file")
            if theirs and theirs != os.path.abspath(paths.connection_file()):
                raise LauncherUnavailable(
                    f"launcher: another launcher (pid {pid}) serves {data}, with its connection "
                    f"file {theirs} in another runtime directory; run with "
                    f"JUPYTER_RUNTIME_DIR={os.path.dirname(theirs)}, or stop it (kill {pid})")
            now = time.monotonic()
            if client is not None and verdict == GONE and client.pid == pid:
                # Its own launcher, silent: frozen, or only busy for a moment (starting,
                # adopting jobs on a loaded machine). Asked again for FROZEN_AFTER seconds.
                silent_since = now if silent_since is None else silent_since
            else:
                silent_since = None
            if (silent_since is not None and now - silent_since >= FROZEN_AFTER) or now > deadline:
                where = f" at {client.url}" if client is not None else ""
                raise LauncherUnavailable(
                    f"launcher: pid {pid} holds {data} but does not answer{where} (stopped or "
                    f"frozen); `kill -CONT {pid}` if it was stopped, else end it with "
                    f"`kill -9 {pid}` and start it again (its jobs keep running and are adopted)")
            time.sleep(0.1)  # starting: its connection file is not written yet (or STALE)

    def identify(self, timeout: float = 2.0) -> str:
        """PROVEN, GONE (nothing answers in time) or IMPOSTOR (something answers that cannot
        prove the key): asked without the token, which goes only to a proven launcher."""
        try:
            if self.identity_key is None:  # nothing to check it with: as before, with the token
                ok = bool(self._request("GET", "/healthz", timeout=timeout)[1].get("ok"))
                return PROVEN if ok else IMPOSTOR
            answer = identity.exchange(self.url + "/healthz", "GET", None, {}, self.identity_key,
                                       timeout, self._tls)
        except LauncherUnavailable:
            return GONE
        except LauncherError:
            return IMPOSTOR
        except http.client.RemoteDisconnected:
            return GONE
        except http.client.HTTPException:
            return IMPOSTOR  # something that does not even speak HTTP
        except (OSError, ValueError):
            return GONE
        if not answer.proven:
            return IMPOSTOR
        return STALE if None not in (self.pid, answer.pid) and self.pid != answer.pid else PROVEN

    def alive(self) -> bool:
        return self.identify() == PROVEN

    def impostor_message(self) -> str:
        port = urllib.parse.urlsplit(self.url).port
        return (f"launcher: port {port} is answered by something that is not this data dir's "
                f"launcher ({port_holder(port) if port else 'its holder is unknown'}); the token "
                f"was not sent. Stop it, or delete {os.path.join(paths.data_dir(), 'launcher.port')} "
                f"to start the launcher on another port (running jobs report to {port})")

    def _prove(self, timeout: float | None) -> None:
        """Before the token leaves: is this still our launcher?"""
        if self.identity_key is None:
            return
        verdict = self.identify(timeout or self.timeout)
        if verdict == IMPOSTOR:
            raise NotTheLauncher(self.impostor_message())
        if verdict == GONE:
            raise LauncherUnavailable(f"launcher: unreachable at {self.url}")
        if verdict == STALE:
            raise LauncherUnavailable(f"launcher: restarted at {self.url}; connect again for "
                                      "its new token")

    # -- HTTP ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                timeout: float | None = None) -> tuple[int, dict]:
        self._prove(timeout)
        return self._request(method, path, body, params, timeout)

    def _request(self, method: str, path: str, body: Any = None, params: dict | None = None,
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
    def submit(self, spec: JobSpec | dict, dry_run: bool = False) -> dict:
        """Submit a job (its detail), or with `dry_run` only answer what its engine would be
        asked (`{"engine", "job_id", "request"}`: formatting.dry_run_text shows it)."""
        # Relative paths mean the caller's directory, which only this side knows.
        data = resolve_paths(spec.to_dict() if isinstance(spec, JobSpec) else dict(spec))
        if isinstance(spec, dict):
            JobSpec.from_dict(dict(data))  # the same one-line errors before the round trip
        if dry_run:
            return self.request("POST", "/api/jobs", params={"dry_run": 1}, body=data)[1]
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

    def metrics_after(self, job_id: str, since: int = 0) -> Iterator[dict]:
        """Every point after `since`, page after page, to the newest stored now."""
        while True:
            page = self.metrics(job_id, since=since)
            yield from page["points"]
            if not page["points"] or page["last_seq"] <= since:
                return
            since = page["last_seq"]

    def events(self, job_id: str, since: int = 0) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/events", since=since)["events"]

    def checkpoints(self, job_id: str) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/checkpoints")["checkpoints"]

    def goodput(self, job_id: str) -> dict:
        """The job's goodput ledger (launcher/goodput.py)."""
        return self._get(f"/api/jobs/{job_id}/goodput")

    def diagnosis(self, job_id: str) -> list[dict]:
        return self._get(f"/api/jobs/{job_id}/diagnosis")["diagnoses"]

    def why(self, job_id: str) -> dict:
        """The diagnoses of failed attempts and, for a job that did not fail, the
        performance verdict (`verdict`, None without a step breakdown)."""
        return self._get(f"/api/jobs/{job_id}/diagnosis")

    def evidence(self, job_id: str) -> list[dict]:
        """The evidence folders kept before a hung or failing attempt was killed."""
        return self._get(f"/api/jobs/{job_id}/evidence")["evidence"]

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
        self._prove(timeout)
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


def lock_holder(data_dir: str) -> dict | None:
    """The launcher that holds `data_dir` (its lock, paths.LOCK_FILE): {"pid",
    "connection_file"?} as it wrote them, or None when no process holds it."""
    path = os.path.join(data_dir, paths.LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}  # being written: the pid comes from the kernel's list below
        holder = holder if isinstance(holder, dict) else {}
        pid = _flock_pid(os.fstat(fd))
        if pid is not None and pid != holder.get("pid"):
            holder = {"pid": pid}  # what the file says is an earlier launcher's
        return holder
    finally:
        os.close(fd)


def _flock_pid(stat: os.stat_result) -> int | None:
    """The pid holding a flock on the file of `stat`, from /proc/locks (Linux)."""
    want = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                # "1: FLOCK  ADVISORY  WRITE 4242 00:2f:123 0 EOF"; waiters have "->"
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want:
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def port_holder(port: int) -> str:
    """Who listens on TCP `port` here, as far as this user may know: "pid N (user U) holds
    it", "user U holds it" (another user's process), or that it is unknown."""
    owners: dict[str, int] = {}  # socket inode -> uid
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    # local address "0100007F:1F90", state 0A = LISTEN, uid, inode
                    if len(fields) > 9 and fields[3] == "0A" and \
                            int(fields[1].rsplit(":", 1)[1], 16) == port:
                        owners[fields[9]] = int(fields[7])
        except (OSError, ValueError):
            continue
    if not owners:
        return "its holder is unknown"
    uid = next(iter(owners.values()))
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        user = f"uid {uid}"
    if uid == os.getuid():  # our own processes' descriptors are readable
        wanted = {f"socket:[{inode}]" for inode in owners}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                    return f"pid {pid} (user {user}) holds it"
            except OSError:
                continue
    return f"user {user} holds it"
