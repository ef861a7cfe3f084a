"""Rank reports against a real HTTP server on loopback (stdlib http.server): batching,
heartbeats, a launcher that goes down and comes back, commands, NaN and stop handling.

The server is a recording stand-in for the launcher's report route, not the launcher: these
tests count and inspect every POST (how many, in which batches, duplicated or not, exactly
when the server went away), which the real launcher stores but does not expose. The same
behaviours run end to end against the real launcher in tests/test_jobs.py (reports reach a
launcher restarted after kill -9), tests/test_recovery.py (SIGTERM checkpoint, kill -9
resume) and tests/test_alert_jobs.py (NaN).
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jupyter_dlc import layout
from jupyter_dlc.runtime import breakdown
from jupyter_dlc.runtime.env import rank_info
from jupyter_dlc.runtime.report import Reporter

JOB_ID = "job-test"
TOKEN = "job-token"


class LauncherStub:
    """Just the report route of the launcher: records every accepted report, answers with
    the commands set on it, and refuses a wrong token with 401."""

    def __init__(self, port=0):
        self.reports = []
        self.commands = []
        self.fail_data = None  # a status to answer every report that carries entries
        self.extra = {}  # more fields for every answer
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if (self.path != f"/api/jobs/{JOB_ID}/report"
                        or self.headers.get("Authorization") != f"token {TOKEN}"):
                    self._answer(401, {"error": "token: wrong or missing"})
                    return
                report = json.loads(body)
                if stub.fail_data and any(report.get(k) for k in ("metrics", "system", "events")):
                    self._answer(stub.fail_data, {"error": "internal error"})
                    return
                with stub.lock:
                    stub.reports.append(report)
                    commands = list(stub.commands)
                self._answer(200, {"ok": True, "commands": commands, **stub.extra})

            def _answer(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def entries(self, kind):
        with self.lock:
            return [dict(entry, rank=r["rank"]) for r in self.reports for entry in r.get(kind, [])]

    def events(self, type_):
        return [e for e in self.entries("events") if e["type"] == type_]

    def wait_for(self, predicate, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return False


@pytest.fixture
def launcher():
    stub = LauncherStub()
    yield stub
    stub.stop()


def make_reporter(url, commands=None, token=TOKEN, heartbeat=5.0, capacity=20000):
    info = dataclasses.replace(rank_info(), launcher_url=url, job_id=JOB_ID, token=token,
                               heartbeat_interval=heartbeat, rank=3, node_rank=1, attempt=2)
    return Reporter(info, (commands if commands is not None else []).extend, capacity)


def test_metrics_arrive_batched_with_identity(launcher):
    reporter = make_reporter(launcher.url)
    for step in range(1000):
        reporter.metric(step, {"loss": step / 10})
    assert reporter.flush(10)
    metrics = launcher.entries("metrics")
    assert [m["step"] for m in metrics] == list(range(1000))
    assert metrics[5]["values"] == {"loss": 0.5}
    assert len(launcher.reports) <= 5, "1000 metrics logged at once must go out in a few POSTs"
    first = launcher.reports[0]
    assert (first["rank"], first["node"], first["attempt"], first["pid"]) == (3, 1, 2, os.getpid())


def test_heartbeat_without_metrics(launcher):
    make_reporter(launcher.url, heartbeat=0.2)
    # Four heartbeats arrive with nothing else logged: waited for, not timed.
    assert launcher.wait_for(lambda: len([r for r in launcher.reports
                                          if not r["metrics"] and not r["events"]]) >= 4)


def test_nothing_lost_while_launcher_restarts(launcher):
    reporter = make_reporter(launcher.url)
    for step in range(100):
        reporter.metric(step, {"loss": 1.0})
    assert reporter.flush(10)
    launcher.stop()
    for step in range(100, 200):
        reporter.metric(step, {"loss": 1.0})
    reporter.event("checkpoint", step=150, path="/x", seconds=0.1, size=1)
    time.sleep(1.5)  # several failed attempts while nobody listens
    assert not reporter.flush(0.2)
    restarted = LauncherStub(port=launcher.port)
    try:
        assert reporter.flush(15)
        steps = [m["step"] for m in launcher.entries("metrics") + restarted.entries("metrics")]
        assert sorted(steps) == list(range(200))
        assert [e["step"] for e in restarted.events("checkpoint")] == [150]
        assert reporter.dropped == 0
    finally:
        restarted.stop()


def test_full_buffer_drops_oldest_and_counts(launcher):
    launcher.stop()
    reporter = make_reporter(launcher.url, capacity=10)
    for step in range(25):
        reporter.metric(step, {"loss": 1.0})
    assert reporter.dropped == 15
    restarted = LauncherStub(port=launcher.port)
    try:
        assert reporter.flush(15)
        assert [m["step"] for m in restarted.entries("metrics")] == list(range(15, 25))
    finally:
        restarted.stop()


def test_refused_report_is_not_retried_forever(launcher, capfd):
    reporter = make_reporter(launcher.url, token="wrong")
    reporter.metric(1, {"loss": 1.0})
    assert reporter.flush(5)
    assert launcher.reports == []
    assert "launcher refused a report (401)" in capfd.readouterr().err


def test_commands_in_the_answer_reach_the_runtime(launcher):
    received = []
    launcher.commands = ["checkpoint"]
    reporter = make_reporter(launcher.url, commands=received)
    reporter.metric(1, {"loss": 1.0})
    assert reporter.flush(5)
    assert received and set(received) == {"checkpoint"}


def run_rank_script(body, launcher, tmp_path, timeout=60, **env):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(body))
    environment = dict(os.environ, DLC_LAUNCHER_URL=launcher.url, DLC_JOB_ID=JOB_ID,
                       DLC_TOKEN=TOKEN, DLC_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
                       DLC_HEARTBEAT_INTERVAL="0.3")
    environment.update(env)
    return subprocess.Popen([sys.executable, str(script)], env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


LOOP = """
    import time, torch
    from jupyter_dlc import runtime
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = runtime.Checkpointer(model=model, optimizer=optimizer)
    for step in range(1, 100000):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        runtime.log(step, loss=LOSS)
        if step % 2 == 0:
            ckpt.save(step)
            ckpt.wait()
        time.sleep(0.02)
"""


def test_stop_command_checkpoints_then_exits_zero(launcher, tmp_path):
    proc = run_rank_script(LOOP.replace("LOSS", "1.0"), launcher, tmp_path)
    try:
        assert launcher.wait_for(lambda: any(m["step"] >= 3 for m in launcher.entries("metrics"))
                                 and launcher.entries("system"))
        launcher.commands = ["stop"]
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    [preempted] = launcher.events("preempted")
    latest = layout.latest_committed(str(tmp_path / "ckpt"))
    assert latest["step"] == preempted["step"]
    assert "stop command" in preempted["reason"]
    assert [e["step"] for e in launcher.events("checkpoint")][-1] == preempted["step"]
    system = launcher.entries("system")
    assert system and all(s["device"] == "cpu" for s in system)
    assert all(0 <= s["values"]["mem_used"] <= 1 for s in system)
    assert any(0 <= s["values"].get("cpu_util", -1) <= 1 for s in system)
    assert all(set(m["values"]) - set(breakdown.RESERVED) == {"loss"} for m in launcher.entries("metrics"))


def test_nan_loss_reports_keeps_last_good_checkpoint_and_fails(launcher, tmp_path):
    body = LOOP.replace("LOSS", "float('nan') if step == 5 else 1.0").replace(
        "runtime.log(step,", "try_log(step,")
    body = body.replace("for step in", """def try_log(step, **values):
        try:
            runtime.log(step, **values)
        except runtime.NonFiniteLossError:
            ckpt.save(step)  # must be refused: state after a NaN is not a good checkpoint
            ckpt.wait()
            raise
    for step in""")
    proc = run_rank_script(body, launcher, tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert err.strip().splitlines()[-1].endswith(
        "NonFiniteLossError: loss is nan at step 5; stopped, last good checkpoint kept")
    assert [(e["step"], e["name"]) for e in launcher.events("nan")] == [(5, "loss")]
    assert layout.latest_committed(str(tmp_path / "ckpt"))["step"] == 4
    assert not os.path.exists(layout.step_dir(str(tmp_path / "ckpt"), 5))
    assert not any(math.isnan(m["values"].get("loss", 0)) for m in launcher.entries("metrics"))


def test_a_batch_failing_with_500_does_not_stop_heartbeats(launcher, capfd):
    """A launcher that answers 500 to one batch's content (it did, for a string step) must
    still hear the rank: heartbeats go on, and the batch is dropped with its reason."""
    launcher.fail_data = 500
    reporter = make_reporter(launcher.url, heartbeat=0.2)
    reporter.metric(1, {"loss": 1.0})
    assert reporter.flush(30), "the poisoned batch was retried forever"
    beats = [r for r in launcher.reports if not r.get("metrics")]
    assert len(beats) >= 3, "no heartbeat while the batch failed"
    assert "dropped 1 entries" in capfd.readouterr().err
    launcher.fail_data = None
    reporter.metric(2, {"loss": 0.5})
    assert reporter.flush(10)
    assert [m["step"] for m in launcher.entries("metrics")] == [2]


def test_reporter_thread_survives_what_it_cannot_encode(launcher, capfd):
    reporter = make_reporter(launcher.url)
    reporter.event("checkpoint", step=object())
    assert reporter.flush(10)
    assert "cannot be sent as JSON" in capfd.readouterr().err
    reporter.metric(3, {"loss": 1.0})
    assert reporter.flush(10), "the reporter thread died"
    assert [m["step"] for m in launcher.entries("metrics")] == [3]


SCALARS = """
    import numpy as np, torch
    from jupyter_dlc import runtime
    for i in range(1, 6):
        runtime.log(np.int64(i), loss=torch.tensor(0.5 * i), acc=np.float32(0.25), n=np.int32(i), k=i,
                    lr=0.1)
    for bad in ("runtime.log('7', loss=1.0)", "runtime.log(2.5, loss=1.0)",
                "runtime.log(8, loss='0.5')", "runtime.log(8, loss=[1.0])",
                "runtime.log(8, loss=torch.ones(3))"):
        try:
            eval(bad)
        except TypeError as error:
            print("REFUSED", error, flush=True)
    runtime.shutdown()
"""


def test_numpy_and_tensor_scalars_log_and_anything_else_is_refused_where_logged(launcher, tmp_path):
    proc = run_rank_script(SCALARS, launcher, tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    metrics = launcher.entries("metrics")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert {k: v for k, v in metrics[-1]["values"].items() if k not in breakdown.RESERVED} == \
        {"loss": 2.5, "acc": 0.25, "n": 5.0, "k": 5.0, "lr": 0.1}
    assert set(breakdown.RESERVED) <= set(metrics[-1]["values"])  # the step's breakdown beside
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 5, out
    assert "step must be a whole number" in refused[0] and "step must be a whole number" in refused[1]
    assert all("loss= must be a number" in line for line in refused[2:])


def test_a_rank_reports_directly_when_its_node_reporter_is_gone(launcher, tmp_path, monkeypatch):
    """A node reporter's URL file left behind by one that ended: the rank's report goes to
    the launcher itself, at once and complete."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    (tmp_path / "node-1.reporter").write_text(f"http://127.0.0.1:{dead}\n")
    monkeypatch.setenv("DLC_NODE_REPORTER", str(tmp_path / "node-1.reporter"))
    reporter = make_reporter(launcher.url)  # node 1
    for step in range(20):
        reporter.metric(step, {"loss": 1.0})
    assert reporter.flush(10)
    assert [m["step"] for m in launcher.entries("metrics")] == list(range(20))
    assert reporter.reports_via_node == 0 and reporter.dropped == 0


def test_a_rank_reports_directly_when_its_node_reporter_is_stuck(launcher, tmp_path, monkeypatch):
    """A node reporter that takes connections but never answers (stopped, deadlocked): the
    rank's report still reaches the launcher, directly, once the request to it timed out."""
    import socket

    from jupyter_dlc.node.reporter import COALESCE, FORWARD_TIMEOUT, MAX_PACE
    from jupyter_dlc.runtime.report import HTTP_TIMEOUT

    # A live reporter always answers before the rank's timeout (503 past its own), also
    # when it holds the batch to keep the launcher's pace.
    assert FORWARD_TIMEOUT + max(COALESCE, MAX_PACE) < HTTP_TIMEOUT + MAX_PACE
    with socket.socket() as stuck:  # the kernel completes connections; nobody reads them
        stuck.bind(("127.0.0.1", 0))
        stuck.listen(8)
        (tmp_path / "node-1.reporter").write_text(f"http://127.0.0.1:{stuck.getsockname()[1]}\n")
        monkeypatch.setenv("DLC_NODE_REPORTER", str(tmp_path / "node-1.reporter"))
        reporter = make_reporter(launcher.url)  # node 1
        for step in range(20):
            reporter.metric(step, {"loss": 1.0})
        assert reporter.flush(3 * (HTTP_TIMEOUT + MAX_PACE))
    assert [m["step"] for m in launcher.entries("metrics")] == list(range(20))
    assert reporter.reports_via_node == 0 and reporter.dropped == 0


def test_the_report_interval_grows_with_the_world(monkeypatch):
    from jupyter_dlc.runtime.report import BATCH_INTERVAL, MIN_BATCH_INTERVAL, batch_interval, interval_override

    monkeypatch.delenv("DLC_REPORT_INTERVAL", raising=False)
    assert batch_interval(4) == MIN_BATCH_INTERVAL
    assert MIN_BATCH_INTERVAL < batch_interval(64) < BATCH_INTERVAL
    assert batch_interval(4096) == BATCH_INTERVAL
    monkeypatch.setenv("DLC_REPORT_INTERVAL", "0.5")
    assert batch_interval(4096) == 0.5
    monkeypatch.setenv("DLC_REPORT_INTERVAL", "soon")  # not a number: the default stands
    assert batch_interval(4) == MIN_BATCH_INTERVAL
    assert interval_override() is None  # and a busy rank stretches it as with none set


BUSY_THEN_IDLE = """
    import time
    from jupyter_dlc import runtime
    step = 0
    for busy, seconds in ((1.0, 3.5), (0.0, 3.0)):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            step += 1
            if busy:  # a CPU-bound step of 2 ms
                spin = time.perf_counter() + 0.002
                while time.perf_counter() < spin:
                    pass
            else:  # a step that waits (input, a device): 10 ms
                time.sleep(0.01)
            runtime.log(step, busy=busy)
    assert runtime.get_reporter().flush(10)
"""


def test_a_busy_rank_reports_less_often_and_an_idle_one_at_its_own_pace(launcher, tmp_path):
    """A rank whose process keeps a core busy stretches its report interval towards
    BUSY_BATCH_INTERVAL (each report costs its step time); once it waits again, its reports
    come at its own short interval (what the live views need)."""
    from jupyter_dlc.runtime.report import BUSY_BATCH_INTERVAL, MIN_BATCH_INTERVAL

    proc = run_rank_script(BUSY_THEN_IDLE, launcher, tmp_path, DLC_HEARTBEAT_INTERVAL="5")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    sent = [(r["t"], {m["values"]["busy"] for m in r["metrics"]}) for r in launcher.reports if r.get("metrics")]
    busy = [t for t, phases in sent if phases == {1.0}]
    idle = [t for t, phases in sent if phases == {0.0}][:-1]  # the last: flush() sends at once

    def gaps(times):
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    # The last second of each phase: the interval is set anew at most once a second.
    late_busy = gaps([t for t in busy if t > busy[-1] - 1.2])
    late_idle = gaps([t for t in idle if t > idle[-1] - 1.0])
    assert late_busy and min(late_busy) > 0.7 * BUSY_BATCH_INTERVAL, late_busy
    assert late_idle and max(late_idle) < 2 * MIN_BATCH_INTERVAL, late_idle


def test_a_rank_reporting_directly_keeps_the_launchers_pace(launcher):
    """An answer's `report_interval` (launcher/pacing.py) slows a rank that reports directly,
    never below its own pace, and never past the most a node reporter holds a batch."""
    from jupyter_dlc.node.reporter import MAX_PACE

    reporter = make_reporter(launcher.url)
    own = reporter.batch_interval
    launcher.extra = {"report_interval": 0.75}
    reporter.metric(0, {"loss": 1.0})
    assert reporter.flush(10)
    assert reporter.batch_interval == max(own, 0.75)
    launcher.extra = {"report_interval": 60}
    reporter.metric(1, {"loss": 1.0})
    assert reporter.flush(10)
    assert reporter.batch_interval == MAX_PACE
    launcher.extra = {}
    reporter.metric(2, {"loss": 1.0})
    assert reporter.flush(10)
    assert reporter.batch_interval == own


def test_a_report_leaves_with_the_log_that_makes_it_due(launcher):
    """A loop of 20 steps a second against a 0.1 s interval: each report leaves right after
    the log() that found it due, so the batches line up with the steps and each one's newest
    point waits nothing (a timer of its own, at a random phase to the steps, kept it waiting
    25 ms on average). Still at most one report a batch interval."""
    reporter = make_reporter(launcher.url)
    interval = reporter.batch_interval
    period = interval / 2
    for step in range(40):
        reporter.metric(step, {"loss": 1.0})
        time.sleep(period)
    assert reporter.flush(10)
    sent = [(r["t"], max(m["t"] for m in r["metrics"])) for r in launcher.reports if r.get("metrics")]
    sent = sent[2:-1]  # the first reports (an idle sender sends at once), the flush
    ages = sorted(t - newest for t, newest in sent)
    gaps = sorted(b[0] - a[0] for a, b in zip(sent, sent[1:], strict=False))
    assert ages[len(ages) // 2] < 0.15 * period, ages
    assert gaps[0] > 0.8 * interval, gaps
