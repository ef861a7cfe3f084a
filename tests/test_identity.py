"""Ranks and clients know they talk to their launcher (jupyter_dlc/identity.py), and say who
holds the port or the data dir when it is not theirs (issue 26, items 6, 7 and 10).

Real parts: a real launcher killed with -9, a real HTTP server bound to its port answering
`{"ok": true, "commands": ["stop"]}`, real ranks, the real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import _alive, wait_for
from jupyter_dlc.client import LauncherClient

CLI = [sys.executable, "-m", "jupyter_dlc.cli"]

# Runs until the test creates the file named in argv[1], then a few steps more.
UNTIL_TOLD = """
import os, sys, time
from jupyter_dlc import runtime
runtime.init()
step, end = 0, None
while end is None or step < end:
    step += 1
    time.sleep(0.05)
    runtime.log(step, loss=1.0 / step)
    if end is None and os.path.exists(sys.argv[1]):
        end = step + 5
print("ended at", step, flush=True)
"""


class StandIn:
    """Whatever took the launcher's port: answers every request as a launcher that wants
    every rank stopped would, and remembers what it was sent."""

    ANSWER = {"ok": True, "pid": 1, "commands": ["stop"],
              "rank_commands": {str(r): ["stop"] for r in range(8)}}

    def __init__(self, port: int):
        self.requests: list[dict] = []
        self.arrived = threading.Condition()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with stand_in.arrived:
                    stand_in.requests.append({"method": self.command, "path": self.path,
                                              "headers": dict(self.headers), "body": body})
                    stand_in.arrived.notify_all()
                data = json.dumps(StandIn.ANSWER).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args) -> None:
                pass

        # The port is free once the killed launcher (and its ingest worker) are gone.
        self.server = wait_for(lambda: _try_bind(port, Handler), 20, what="the launcher's port free")
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reports(self, job_id: str) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests
                if r["path"] == f"/api/jobs/{job_id}/report" and r["body"]]

    def saw(self, secret: str) -> bool:
        return any(secret in r["path"] or secret in json.dumps(r["headers"]) for r in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _try_bind(port: int, handler) -> ThreadingHTTPServer | None:
    try:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        return None


def kill_launcher(launcher) -> int:
    """kill -9 the launcher; returns its port."""
    pid = launcher.pid()
    port = urllib.parse.urlsplit(launcher.client.url).port
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 10, what="the launcher gone")
    return port


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_ranks_ignore_a_stand_in_on_the_launchers_port_and_go_on_to_their_real_end(launcher, tmp_path):
    script = launcher.script("until_told.py", UNTIL_TOLD)
    told = str(tmp_path / "told")
    # Through a node reporter (2 ranks on a node) and directly (1 rank).
    jobs = [launcher.client.submit({"script": script, "args": [told], "nodes": 1,
                                    "nproc_per_node": n}) for n in (2, 1)]
    for job in jobs:
        wait_for(lambda job=job: (launcher.client.job(job["id"])["last_step"] or 0) >= 3, 120,
                 what="steps reported")
    port = kill_launcher(launcher)
    stand_in = StandIn(port)
    try:
        # Every path has had its answers to "stop" from the stand-in, several times over.
        with stand_in.arrived:
            stand_in.arrived.wait_for(lambda: all(len(stand_in.reports(j["id"])) >= 4 for j in jobs),
                                      60)
        assert any("ranks" in r for r in stand_in.reports(jobs[0]["id"])), "node batches"
        assert all("ranks" not in r for r in stand_in.reports(jobs[1]["id"])), "direct reports"
        # Obeyed, the ranks would be leaving at their next step (0.05 s away); they still run.
        running = {job for (job, _), pids in _job_processes().items() if pids}
        assert {j["id"] for j in jobs} <= running
    finally:
        stand_in.close()
    launcher.client = LauncherClient.connect()  # the real launcher, back on the same port
    assert urllib.parse.urlsplit(launcher.client.url).port == port
    seen = {j["id"]: launcher.client.job(j["id"])["last_step"] or 0 for j in jobs}
    for job in jobs:  # reporting again, to the real launcher
        wait_for(lambda job=job: (launcher.client.job(job["id"])["last_step"] or 0) > seen[job["id"]],
                 60, what="steps after the launcher came back")
    open(told, "w").close()
    for job in jobs:
        ended = launcher.client.wait(job["id"], timeout=120)
        assert ended["state"] == "SUCCEEDED", ended["reason"]
        lines = [line["text"] for line in launcher.client.logs(job["id"])["lines"]]
        ends = [int(text.split()[-1]) for text in lines if text.startswith("ended at")]
        # Every rank ran to the end the test gave it, past where it was when the launcher
        # came back (the ranks step on their own: no collective in the loop).
        assert len(ends) == len(ended["ranks"]) and min(ends) > seen[job["id"]], (ends, seen)
        assert ended["last_step"] in ends
        assert not any("stop command" in (e["reason"] or "") for e in launcher.client.events(job["id"]))
    direct = " ".join(line["text"] for line in launcher.client.logs(jobs[1]["id"])["lines"])
    assert "cannot prove it is this job's launcher" in direct


def _job_processes():
    from jupyter_dlc.hostprocs import job_processes

    return job_processes()


def test_clients_send_no_token_to_a_stand_in_and_say_who_holds_the_port(launcher):
    token = launcher.client.token
    port = kill_launcher(launcher)
    stand_in = StandIn(port)
    try:
        for args in (["list"], ["launcher", "start"], ["launcher", "status"]):
            started = time.monotonic()
            done = cli(*args)
            assert done.returncode != 0, (args, done.stdout)
            error = done.stderr.strip()
            assert len(error.splitlines()) == 1 and "Traceback" not in error, error
            assert f"port {port} is answered by something that is not this data dir's launcher" \
                in error, error
            assert f"pid {os.getpid()} " in error, error  # the stand-in is this test's process
            assert time.monotonic() - started < 20
        assert stand_in.requests and all(r["path"].startswith("/healthz") for r in stand_in.requests)
        assert not stand_in.saw(token), "the launcher token went to the stand-in"
        from jupyter_dlc.client import lock_holder

        assert lock_holder(launcher.data_dir) is None, "no launcher started beside the stand-in"
    finally:
        stand_in.close()
    launcher.client = LauncherClient.connect()


def test_a_frozen_launcher_is_named_with_its_pid(launcher):
    pid = launcher.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        for args in (["list"], ["launcher", "start"]):
            started = time.monotonic()
            done = cli(*args)
            error = done.stderr.strip()
            assert done.returncode != 0 and len(error.splitlines()) == 1, error
            assert f"pid {pid} holds {launcher.data_dir} but does not answer" in error, error
            assert "did not start" not in error and "not running" not in error
            assert time.monotonic() - started < 20, "answered at once, not after 30 s"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert launcher.client.alive()


def test_a_launcher_with_another_runtime_dir_is_named(launcher, tmp_path):
    pid = launcher.pid()
    other = {"JUPYTER_RUNTIME_DIR": str(tmp_path / "other-runtime")}
    for args in (["launcher", "start"], ["list"], ["run", launcher.script("x.py", "print(1)\n")]):
        started = time.monotonic()
        done = cli(*args, env=other)
        error = done.stderr.strip()
        assert done.returncode != 0 and len(error.splitlines()) == 1, error
        assert f"another launcher (pid {pid}) serves {launcher.data_dir}" in error, error
        assert f"JUPYTER_RUNTIME_DIR={launcher.runtime_dir}" in error, error
        assert time.monotonic() - started < 20, "answered at once, not after 30 s"


def test_tokens_are_redacted_from_access_logs_however_the_query_spells_them(launcher):
    token = launcher.client.token
    spellings = [f"tok%65n={token}", f"%74%6F%6B%65%6E={token}", f"x=1&token={token}"]
    for n, query in enumerate(spellings):
        try:
            urllib.request.urlopen(f"{launcher.client.url}/api/jobs/missing-{n}?{query}", timeout=10)
        except urllib.error.HTTPError as error:
            assert error.code == 404  # authenticated: the token was taken, the job is missing
    log = os.path.join(launcher.data_dir, "launcher.log")

    def logged() -> str | None:
        with open(log) as f:
            text = f.read()
        return text if all(f"missing-{n}" in text for n in range(len(spellings))) else None

    text = wait_for(logged, 20, what="the 404s in the launcher's log")
    assert token not in text and urllib.parse.quote(token) not in text
    assert text.count("[redacted]") >= len(spellings)


def test_cli_commands_leave_quietly_on_a_closed_pipe(launcher):
    job = launcher.client.submit({"script": launcher.script("hello.py", "print('hello')\n"),
                                  "nodes": 1, "nproc_per_node": 1})
    launcher.client.wait(job["id"], timeout=120)
    for args in (["status", job["id"]], ["list"], ["logs", job["id"]], ["launcher", "status"]):
        read, write = os.pipe()
        os.close(read)  # `| head` that has all it wanted
        try:
            done = subprocess.run([*CLI, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                                  timeout=60)
        finally:
            os.close(write)
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, (args, done.stderr)
        assert done.returncode == 141, (args, done.returncode)


def test_a_store_that_lost_its_jobs_is_said_at_the_next_start(launcher):
    job = launcher.client.submit({"script": launcher.script("hello.py", "print('hello')\n"),
                                  "nodes": 1, "nproc_per_node": 1})
    launcher.client.wait(job["id"], timeout=120)
    wal = os.path.join(launcher.data_dir, "launcher.sqlite-wal")
    os.unlink(wal)  # under the running launcher
    kill_launcher(launcher)
    done = cli("launcher", "start")
    assert done.returncode == 0, done.stderr
    launcher.client = LauncherClient.connect()
    assert job["id"] not in {j["id"] for j in launcher.client.jobs()}, \
        "the job survived (its WAL was checkpointed): this test needs it lost"
    warning = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warning) == 1 and f"1 job(s) in {launcher.data_dir}" in warning[0], done.stderr
    assert job["id"] in warning[0] and "no record" in warning[0]
    with open(os.path.join(launcher.data_dir, "launcher.log")) as f:
        assert "no record" in f.read()


def test_a_port_answered_by_a_real_launcher_of_another_data_dir_is_not_ours(launcher, tmp_path):
    """Proof, not just an answer: another user's (or data dir's) real launcher on the port
    cannot prove this data dir's identity either."""
    from conftest import LauncherEnv

    ours = launcher.client
    other = LauncherEnv(str(tmp_path / "other"))
    try:
        impostor = LauncherClient(other.client.url, ours.token, identity_key=ours.identity_key)
        assert impostor.identify() == "impostor"
        assert not impostor.alive()
    finally:
        other.close()
        os.environ.update(launcher.env)
    assert ours.alive()


def test_a_kept_channel_reuses_its_connection_proves_answers_and_survives_a_server_closing_it():
    """identity.Channel (the ranks' report sender): one connection for many requests where
    the server keeps it (HTTP/1.1), a new one each time where it closes (HTTP/1.0), chunked
    answers, answers proven or not; a kept connection the server closed while idle (a
    launcher restart) costs no report: the request goes once more, on a new connection."""
    from jupyter_dlc import identity

    key = "k" * 64
    seen: dict = {"connections": set(), "bodies": []}

    def server(version, chunked=False, drop_idle=False):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = version
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                seen["connections"].add(self.client_address)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                seen["bodies"].append(body)
                answer = json.dumps({"ok": True, "echo": body.decode()}).encode()
                self.send_response(200)
                self.send_header(identity.PROOF_HEADER, identity.proof(
                    key, "POST", self.path, self.headers[identity.NONCE_HEADER],
                    identity.digest(body), 200, answer))
                self.send_header(identity.PID_HEADER, "42")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    half = len(answer) // 2
                    for part in (answer[:half], answer[half:], b""):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                else:
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                self.close_connection = drop_idle  # closed after answering, said nowhere

            def log_message(self, *args) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd

    for version, chunked, drop_idle, connections in (
            ("HTTP/1.1", False, False, 1), ("HTTP/1.0", False, False, 3),
            ("HTTP/1.1", True, False, 3), ("HTTP/1.1", False, True, 3)):
        httpd = server(version, chunked, drop_idle)
        seen["connections"].clear()
        del seen["bodies"][:]
        channel = identity.Channel(f"http://127.0.0.1:{httpd.server_address[1]}/api/jobs/j/report")
        try:
            for i in range(3):
                answer = channel.post(b'{"n": %d}' % i, {"Authorization": "token t"}, key, 3.0)
                assert (answer.status, answer.proven, answer.pid) == (200, True, 42), answer
                assert json.loads(answer.body)["echo"] == '{"n": %d}' % i
                time.sleep(0.05)  # a closing server's FIN arrives while the channel is idle
            assert len(seen["connections"]) == connections, (version, chunked, drop_idle, seen)
            assert seen["bodies"] == [b'{"n": %d}' % i for i in range(3)]  # each once
            assert not channel.post(b"{}", {}, "another key", 3.0).proven
        finally:
            channel.close()
            httpd.shutdown()
            httpd.server_close()
