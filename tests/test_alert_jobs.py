"""Alert rules on real jobs: NaN, no progress, a webhook to a real local HTTP server."""

from __future__ import annotations

import json
import threading
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
