"""Alert rules on real jobs: NaN, no progress, a webhook to a real local HTTP server."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from conftest import wait_for
from jupyter_dlc.client import LauncherError


class Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *args):
        pass


def test_nan_fires_within_a_step_and_posts_the_webhook(launcher):
    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    script = launcher.script("nan.py", """
        import math, time
        from jupyter_dlc import runtime
        runtime.init()
        for step in range(1, 20):
            runtime.log(step, loss=float("nan") if step == 6 else 1.0 / step)
            time.sleep(0.05)
        """)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                  "max_restarts": 0, "alerts": [f"loss is nan -> webhook {url}"]})
    job = launcher.client.wait(job["id"], timeout=90)
    try:
        assert job["state"] == "FAILED"
        assert job["last_step"] <= 6  # nothing trained past the NaN
        alerts = [e for e in launcher.client.events(job["id"]) if e["type"] == "alert"]
        assert len(alerts) == 1, alerts  # once per episode, though two ranks saw it
        assert alerts[0]["data"]["condition"] == "loss is nan"
        wait_for(lambda: Hook.received, 10, what="webhook POST")
        path, body = Hook.received[0]
        assert path == "/hook" and "loss is nan" in json.dumps(body)
        why = launcher.client.diagnosis(job["id"])
        assert why and why[0]["class"] == "nan_loss"
    finally:
        server.shutdown()


def test_no_progress_rule_fires_and_resolves_once(launcher):
    script = launcher.script("stall.py", """
        import time
        from jupyter_dlc import runtime
        runtime.init()
        for step in range(1, 4):
            runtime.log(step, loss=1.0)
        time.sleep(4)             # heartbeats go on, steps do not
        for step in range(4, 8):
            runtime.log(step, loss=1.0)
            time.sleep(0.1)
        """)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 1,
                                  "heartbeat_interval": 0.5, "progress_timeout": "1m",
                                  "alerts": ["no progress for 2s"]})
    job = launcher.client.wait(job["id"], timeout=90)
    assert job["state"] == "SUCCEEDED", job["reason"]
    events = launcher.client.events(job["id"])
    # The start-up (imports before the first step) may count as an episode of its own; the
    # stall after step 3 must be exactly one episode, resolved when steps resume.
    fired = [e for e in events if e["type"] == "alert" and "since the last step" in e["reason"]]
    assert len(fired) == 1, [e["reason"] for e in events]
    assert fired[0]["data"]["detail"]["last_progress"]
    resolved = [e for e in events if e["type"] == "alert_resolved" and e["seq"] > fired[0]["seq"]]
    assert len(resolved) == 1


def test_a_rule_that_does_not_parse_is_refused_at_submit(launcher):
    script = launcher.script("ok.py", "print('hi')\n")
    try:
        launcher.client.submit({"script": script, "alerts": ["gpu_util < 0.3 for fifteen"]})
    except LauncherError as error:
        assert error.status == 400
        assert str(error).startswith("alerts:") and "position" in str(error)
    else:
        raise AssertionError("a bad rule was accepted")
    assert launcher.client.jobs() == []


def test_a_catastrophic_log_regex_leaves_the_launcher_answering(launcher):
    """Issue 26 item 7: `(a+)+$` against 30 `a` and a `!` is 2**30 backtracking paths for
    Python's `re` (25 `a` held /healthz 6.9 s, 30 froze the launcher for minutes, SIGTERM
    ignored). On RE2 the line is one linear pass: /healthz answers at once after the line is in
    the log, the rule still fires on the next line (which does match), and its stop ends the job."""
    client = launcher.client
    pid = launcher.pid()
    script = launcher.script("evil.py", """
        import time
        print("a" * 30 + "!", flush=True)  # (a+)+$ fails here only after trying every split
        print("a" * 30, flush=True)        # and matches here
        time.sleep(120)                    # the rule's stop action ends the job
        """)
    latencies: list[float] = []
    done = threading.Event()

    def probe():  # /healthz all along: the longest answer is the longest freeze
        while not done.is_set():
            started = time.monotonic()
            try:
                client.request("GET", "/healthz", timeout=30)
            except LauncherError:
                pass
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    answered = False
    try:
        job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 1, "max_restarts": 0,
                             "stop_grace": 1, "alerts": ["log matches /(a+)+$/ -> stop"]})
        wait_for(lambda: any(line["text"] == "a" * 30 for line in client.logs(job["id"])["lines"]),
                 60, what="both lines in the rank's log")
        # The alert thread reads new log lines every 0.5 s; a frozen launcher answers nothing.
        assert client.request("GET", "/healthz", timeout=10)[1]["ok"]
        job = client.wait(job["id"], timeout=60)
        answered = True
        assert job["state"] == "STOPPED", job["reason"]
        fired = [e for e in client.events(job["id"]) if e["type"] == "alert"]
        assert len(fired) == 1 and fired[0]["data"]["condition"] == "log matches /(a+)+$/", fired
        assert fired[0]["data"]["detail"]["line"] == "a" * 30  # not the line with the `!`
    finally:
        done.set()
        prober.join(35)
        if not answered:  # a launcher stuck in a match holds the GIL and ignores SIGTERM
            os.kill(pid, signal.SIGKILL)
    # Measured, not timed to the millisecond: the longest answer in a run on a loaded machine.
    assert latencies and max(latencies) < 5, f"/healthz took up to {max(latencies):.1f}s"


def test_a_log_rule_re2_cannot_run_is_refused_at_submit_naming_it(launcher):
    script = launcher.script("ok.py", "print('hi')\n")
    for rule, why in [(r"log matches /(ab)\1/", "invalid escape sequence"),
                      ("log matches /(?=CUDA)OOM/", "invalid perl operator")]:
        try:
            launcher.client.submit({"script": script, "alerts": [rule]})
        except LauncherError as error:
            assert error.status == 400
            message = str(error)
            assert message.startswith(f"alerts: {rule!r}: ") and why in message, message
            assert "\n" not in message and "backreferences or lookaround" in message
        else:
            raise AssertionError(f"{rule} was accepted")
    assert launcher.client.jobs() == []
