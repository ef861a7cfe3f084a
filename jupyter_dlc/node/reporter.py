"""One reporter per node: the node's ranks report to it, it reports to the launcher.

With thousands of ranks, one request per rank every quarter second is more than one
launcher can take. Every engine starts this process beside each node's torchrun agent
(`python -m jupyter_dlc.node.reporter`: the wrapper shell of engines/local/engine.py and of the
Slurm batch script, `ssh_node run` on an SSH host). It listens on loopback and writes its
URL to the file `$DLC_NODE_REPORTER` names, which the engine sets for it and for the
node's ranks alike (runtime/report.py reads it): `<attempt dir>/node-<K>.reporter` in the
attempt directory the node sees, which on an SSH host without a shared filesystem is the
host's own copy. Each rank still POSTs its own report (the protocol of
ARCHITECTURE.md), now to this process, which checks it (token and body, so that a bad entry
is refused to its rank alone), holds the request, and forwards everything that arrived
within COALESCE seconds as one node batch: `{"node", "attempt", "t", "ranks": [report...]}`.

Each rank's request is answered with the launcher's verdict on the batch that carried it:
200 with that rank's commands once the launcher committed it, the launcher's 4xx, or 503
when the launcher could not be reached (the rank keeps its entries and retries, as when it
reports directly). Nothing is acknowledged before the launcher acknowledged it, so this
process holds no data of its own. Ranks that find no reporter (a plain torchrun run, an
engine that does not start one) report directly.

The process leaves when the process that started it (the node's wrapper) is gone. It
forwards to `$DLC_LAUNCHER_URL` trusting `$DLC_LAUNCHER_CA`, as the ranks do.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .. import identity, layout
from ..report_client import (  # noqa: F401 (the reporter's side of the same protocol)
    ENV,
    MAX_PACE,
    RETRYABLE_CLIENT_ERRORS,
    launcher_tls,
    paced,
    phase_shift,
    post_until,
)

COALESCE = 0.05            # seconds a batch waits for more ranks after its first report
FORWARD_TIMEOUT = 2.0      # below the ranks' own HTTP timeout (report.HTTP_TIMEOUT)
MAX_BODY = 4 << 20         # a batch body; the launcher takes 8 MB
MAX_RANK_BODY = 2 << 20    # one rank's report
PARENT_POLL = 0.5


def url_file(attempt_dir: str, node: int | str) -> str:
    """The file an engine names in $DLC_NODE_REPORTER: in the attempt directory the node sees."""
    return os.path.join(attempt_dir, f"node-{node}.reporter")


def wanted(nproc_per_node: int) -> bool:
    """A node reporter pays off only where a node runs more than one rank."""
    return nproc_per_node > 1


def shell_start(python: str, path: str) -> str:
    """Shell text that starts the node's reporter in the background of the node's wrapper
    shell and points the node's ranks at it; goes before the torchrun agent's command.
    `python` and `path` are shell words, made by the caller with `jupyter_dlc.shell` (a
    path may hold the node's variable, as "$node" in a Slurm task)."""
    return f"export {ENV}={path}; {python} -m jupyter_dlc.node.reporter & "


class _Waiter:
    """One rank's held request: answered with (status, answer) once its batch is decided."""

    def __init__(self, report: dict):
        self.report = report
        # Encoded again here rather than forwarded as received: one encoding for the batch.
        self.body = json.dumps(report, allow_nan=False)
        self.done = threading.Event()
        self.status = 503
        self.answer: dict = {"error": "node reporter: launcher unreachable; retry"}

    def finish(self, status: int, answer: dict) -> None:
        self.status, self.answer = status, answer
        self.done.set()


class NodeReporter:
    """Batches the reports handed to `submit` into one launcher request per COALESCE."""

    def __init__(self, launcher_url: str, job_id: str, token: str, node: int, attempt: int,
                 tls: ssl.SSLContext | None = None, start: bool = True, key: str | None = None):
        self.url = f"{launcher_url.rstrip('/')}/api/jobs/{job_id}/report"
        self.token = token
        # The job's key (identity.py): the launcher's answers must prove it, and this
        # process proves it to the node's ranks in turn. None: nothing is checked (older).
        self.key = key
        self.tls = tls
        self.node = node
        self.attempt = attempt
        self.batches_sent = 0
        # Seconds to leave between two batches, as the launcher last asked: one request a
        # node per quarter second is more than it takes with thousands of ranks.
        self.pace = 0.0
        self._shift = 0.0  # once, after the pace grew (phase_shift)
        self._last_forward = 0.0
        self._pending: list[_Waiter] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dlc-node-reporter", daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """For a process that forks its ranks after binding (pool_agent.run_node): no
        thread may run before the forks."""
        self._thread.start()

    def submit(self, report: dict) -> _Waiter:
        """A checked rank report; the waiter is answered once its batch is decided."""
        waiter = _Waiter(report)
        with self._cond:
            self._pending.append(waiter)
            self._cond.notify()
        return waiter

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
            # Let the node's other ranks join this batch, and keep the launcher's pace.
            time.sleep(max(COALESCE, self._last_forward + self.pace + self._shift - time.monotonic()))
            self._last_forward = time.monotonic()
            self._shift = 0.0
            with self._cond:
                waiters, self._pending = self._pending, []
            for part in _split(waiters):
                try:
                    self._forward(part)
                except Exception as error:  # noqa: BLE001 - the ranks' requests must be answered
                    for waiter in part:
                        waiter.finish(503, {"error": f"node reporter: {error!r}; retry"})

    def _forward(self, waiters: list[_Waiter]) -> None:
        head = json.dumps({"node": self.node, "attempt": self.attempt, "t": time.time()})
        data = (head[:-1] + ', "ranks": [' + ", ".join(w.body for w in waiters)
                + "]}").encode()
        headers = {"Content-Type": "application/json", "Authorization": f"token {self.token}"}
        try:
            answer = identity.exchange(self.url, "POST", data, headers, self.key, FORWARD_TIMEOUT,
                                       self.tls)
            reply = json.loads(answer.body or b"{}") if answer.status < 300 else None
        except (OSError, ValueError):
            answer = None
        if answer is None or not answer.proven:
            # Launcher down or restarting, or something else on its port (its answers are
            # none): the ranks keep their entries and retry.
            what = "launcher unreachable" if answer is None else \
                f"{self.url} is answered by something that is not this job's launcher"
            for waiter in waiters:
                waiter.finish(503, {"error": f"node reporter: {what}; retry"})
            return
        if reply is None:
            detail = answer.body[:500].decode(errors="replace")
            try:
                refusal = json.loads(detail)
            except ValueError:
                refusal = {"error": detail.strip() or f"launcher answered {answer.status}"}
            for waiter in waiters:
                waiter.finish(answer.status, refusal)
            return
        self.batches_sent += 1
        pace = paced(reply, MAX_PACE)
        self._shift += phase_shift(self.pace, pace)
        self.pace = pace
        commands = reply.get("rank_commands") or {}
        for waiter in waiters:
            rank = waiter.report.get("rank", 0)
            waiter.finish(200, {"ok": True, "commands": commands.get(str(rank), []),
                                **({"stale": True} if reply.get("stale") else {})})


def _split(waiters: list[_Waiter]) -> list[list[_Waiter]]:
    """Batches whose bodies stay under MAX_BODY (a rank's report alone always fits)."""
    parts: list[list[_Waiter]] = [[]]
    size = 0
    for waiter in waiters:
        if parts[-1] and size + len(waiter.body) > MAX_BODY:
            parts.append([])
            size = 0
        parts[-1].append(waiter)
        size += len(waiter.body) + 2
    return parts


def serve(reporter: NodeReporter, check_report, host: str = "127.0.0.1",
          start: bool = True) -> ThreadingHTTPServer:
    """The loopback route the ranks post to: `POST /report` with the job token. Without
    `start`, bound and listening (ranks may connect) but not answering until `start_serving`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Ranks keep their connection (identity.Channel): the answer's body must not wait
        # behind its headers for the rank's delayed ACK (Nagle), 40 ms a report.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self._body = b""
            if self.path != "/report":
                self._answer(404, {"error": f"route: {self.path} does not exist; use /report"})
                return
            if self.headers.get("Authorization", "") != f"token {reporter.token}":
                self._answer(401, {"error": "token: missing or wrong for this job"})
                return
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > MAX_RANK_BODY:
                self._answer(413, {"error": f"body: larger than {MAX_RANK_BODY} bytes"})
                return
            body = self._body = self.rfile.read(int(length))
            try:
                report = check_report(body)
            except ValueError as error:  # SpecError: one line naming the field
                self._answer(400, {"error": str(error)})
                return
            waiter = reporter.submit(report)
            if not waiter.done.wait(FORWARD_TIMEOUT + COALESCE + 0.5):
                waiter = _Waiter(report)  # 503: the rank retries
            self._answer(waiter.status, waiter.answer)

        def _answer(self, status: int, answer: dict) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            nonce = self.headers.get(identity.NONCE_HEADER)
            if reporter.key and nonce:
                # The ranks check this process as they check the launcher: a port it left
                # behind may be taken by anyone.
                self.send_header(identity.PROOF_HEADER, identity.proof(
                    reporter.key, "POST", self.path, nonce, identity.digest(self._body), status, data))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    if start:
        start_serving(server)
    return server


def start_serving(server: ThreadingHTTPServer) -> None:
    threading.Thread(target=server.serve_forever, name="dlc-node-reporter-http", daemon=True).start()


def publish(server: ThreadingHTTPServer, path: str) -> None:
    """Write the server's URL where the node's ranks look ($DLC_NODE_REPORTER)."""
    layout.write_atomic(path, f"http://127.0.0.1:{server.server_address[1]}\n")


def from_env(env, start: bool = True) -> tuple[NodeReporter, ThreadingHTTPServer]:
    """The node's reporter and its route, for the job the environment names."""
    reporter = NodeReporter(env["DLC_LAUNCHER_URL"], env["DLC_JOB_ID"], env["DLC_TOKEN"],
                            int(env.get("DLC_NODE_RANK", "0")), int(env.get("DLC_ATTEMPT", "1")),
                            launcher_tls(env), start, env.get(identity.KEY_ENV) or None)
    return reporter, serve(reporter, _check_rank_report, start=start)


def _check_rank_report(body: bytes) -> dict:
    from .. import bodies  # stdlib only; keeps torch and tornado out of this process
    from ..spec import SpecError

    try:
        report = bodies.parse_body(body, bodies.REPORT)
    except SpecError as error:
        raise ValueError(str(error)) from None
    if "ranks" in report:
        raise ValueError("ranks: a rank reports for itself; node batches go to the launcher")
    return report


def main() -> int:
    _, server = from_env(os.environ)
    path = os.environ[ENV]
    publish(server, path)
    # A stop signals every process of the job at once: keep serving the ranks' last reports
    # (their final checkpoint event) until the node's wrapper, which outlives torchrun, is gone.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    try:
        os.unlink(path)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
