"""Alert rules: the parser, the evaluator on synthetic series, webhooks POSTed to a real
HTTP server on loopback."""

from __future__ import annotations

import json
import math
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_dlc import wirejson
from jupyter_dlc.launcher.alerts import (
    BASELINE_WINDOW, DEFAULT_RULES, LOG_QUIET_SECONDS, AlertEvaluator, JobSnapshot, parse_rule,
    post_webhook, rules_for, webhook_body, webhook_style,
)
from jupyter_dlc.launcher.store import Store
from jupyter_dlc.spec import SpecError

# ---------------------------------------------------------------------------- parser


@pytest.mark.parametrize("text, fields", [
    ("gpu_util < 0.3 for 15m", dict(kind="threshold", metric="gpu_util", op="<", value=0.3, duration=900)),
    ("loss is nan", dict(kind="nan", metric="loss", action="notify")),
    ("no progress for 15m", dict(kind="no_progress", duration=900)),
    ("checkpoint_seconds > 1800", dict(kind="threshold", metric="checkpoint_seconds", op=">", value=1800,
                                        duration=0)),
    ("log matches /CUDA out of memory/ -> stop", dict(kind="log", pattern="CUDA out of memory", action="stop")),
    ("grad_sync_ms > 2x baseline 3 times -> webhook http://127.0.0.1:9/hook",
     dict(kind="baseline", metric="grad_sync_ms", op=">", factor=2, times=3, action="webhook",
          url="http://127.0.0.1:9/hook")),
    ("samples_per_s<0.5x baseline 5 times->checkpoint-and-stop",
     dict(kind="baseline", op="<", factor=0.5, times=5, action="checkpoint-and-stop")),
    (r"log matches /nccl.*timeout|a\/b/i -> notify", dict(kind="log", pattern="nccl.*timeout|a/b", ignore_case=True)),
    ("mem_used >= 0.95 for 90s -> checkpoint-and-stop", dict(op=">=", value=0.95, duration=90)),
])
def test_parse(text, fields):
    rule = parse_rule(text)
    for name, value in fields.items():
        assert getattr(rule, name) == value, name
    # The canonical form parses back to the same rule.
    assert parse_rule(rule.key).key == rule.key


@pytest.mark.parametrize("text, column, expected", [
    ("gpu_util < abc", 12, "expected a number"),
    ("gpu_util < 0.3 for 15min", 20, "expected a duration"),
    ("gpu_util < 0.3 for 0s", 20, "expected a positive duration"),
    ("gpu_util ~ 0.3", 10, "expected a comparison"),
    ("gpu_util < 0.3 15m", 16, "expected 'for DURATION', '-> ACTION'"),
    ("loss is none", 9, "expected 'nan'"),
    ("no progress 15m", 13, "expected 'for'"),
    ("log matches CUDA", 13, "expected a /regular expression/"),
    ("log matches /CUDA", 18, "expected the closing '/'"),
    ("log matches /a(b/", 15, "expected a valid regular expression"),
    ("grad_sync_ms > 2x baseline three times", 28, "expected a whole number"),
    ("grad_sync_ms > 2x baseline 3", 29, "expected 'times'"),
    ("loss is nan -> email me", 16, "expected an action"),
    ("loss is nan -> webhook ftp://host/x", 24, "expected an http:// or https:// URL"),
    ("loss is nan -> stop now", 21, "expected '-> ACTION' or the end of the rule"),
    ("", 1, "expected a metric name"),
    ("< 3", 1, "expected a metric name"),
])
def test_parse_errors_name_the_column(text, column, expected):
    with pytest.raises(SpecError) as raised:
        parse_rule(text)
    message = str(raised.value)
    assert message.startswith("alerts: ") and "\n" not in message
    assert f"at position {column}: {expected}" in message, message


def test_rules_for_defaults_override_and_off():
    rules = rules_for([], True)
    assert [r.condition for r in rules] == [parse_rule(t).condition for t in DEFAULT_RULES]
    assert rules_for([], False) == []
    mine = rules_for(["loss is nan -> stop", "checkpoint_seconds > 1800"], True)
    nan_rules = [r for r in mine if r.kind == "nan"]
    assert [r.action for r in nan_rules] == ["stop"]  # replaces the default notify
    assert len(mine) == len(DEFAULT_RULES) + 1
    with pytest.raises(SpecError, match="at position 6"):
        rules_for(["loss isnt nan"], True)


# ---------------------------------------------------------------------------- evaluator

def _ticks(evaluator, points_by_time, metric, until, step=10.0, window=120.0, start=0.0, **extra):
    """Drive the evaluator like the supervisor: every `step` seconds, a snapshot holding the
    points of the last `window` seconds (so consecutive snapshots overlap)."""
    out = []
    t = start
    while t <= until:
        recent = [p for p in points_by_time if t - window < p[0] <= t]
        snap = JobSnapshot(metrics={metric: recent}, **extra)
        out += [(t, tr) for tr in evaluator.evaluate(t, snap)]
        t += step
    return out


def _gpu_series(low_from, low_until, end, rank=0, device="gpu0", every=30.0):
    return [(t, rank, 0.1 if low_from <= t < low_until else 0.9, device)
            for t in [i * every for i in range(int(end / every) + 1)]]


def test_gpu_util_low_for_15m_fires_once_then_resolves():
    evaluator = AlertEvaluator([parse_rule("gpu_util < 0.3 for 15m")])
    busy_other = _gpu_series(0, 0, 3000, rank=1, device="gpu1")
    points = _gpu_series(600, 2100, 3000) + busy_other
    transitions = _ticks(evaluator, points, "gpu_util", until=3000)
    assert [(t, tr.kind) for t, tr in transitions] == [(1500, "fired"), (2100, "resolved")]
    fired = transitions[0][1]
    assert fired.detail["series"] == "rank 0 gpu0"
    assert "rank 0 gpu0 at 0.1 for 15m" in fired.message
    payload = fired.payload(job_id="j1")
    assert payload["rule"] == "gpu_util < 0.3 for 15m -> notify" and payload["job_id"] == "j1"
    json.dumps(payload)


def test_gpu_util_interrupted_does_not_fire():
    evaluator = AlertEvaluator([parse_rule("gpu_util < 0.3 for 15m")])
    points = [p for p in _gpu_series(0, 1500, 1500)]
    points[20] = (points[20][0], 0, 0.8, "gpu0")  # one busy sample at 10 minutes
    assert _ticks(evaluator, points, "gpu_util", until=1500) == []


def test_gpu_rule_without_gpu_samples_never_fires():
    evaluator = AlertEvaluator(rules_for([], True))
    cpu_only = [(t, 0, 0.05, "cpu") for t in range(0, 3000, 30)]
    transitions = _ticks(evaluator, cpu_only, "cpu_util", until=3000, last_progress=None, started=None)
    assert transitions == []


def test_threshold_without_for_uses_checkpoint_durations():
    evaluator = AlertEvaluator([parse_rule("checkpoint_seconds > 1800")])
    snap = JobSnapshot(checkpoints=[(100.0, 0, 40.0)])
    assert evaluator.evaluate(100, snap) == []
    snap.checkpoints.append((4000.0, 0, 2400.0))
    fired = evaluator.evaluate(4000, snap)
    assert [tr.kind for tr in fired] == ["fired"] and fired[0].detail["value"] == 2400.0
    assert evaluator.evaluate(4010, snap) == []  # the same point again: no storm
    snap.checkpoints.append((5000.0, 0, 35.0))
    assert [tr.kind for tr in evaluator.evaluate(5000, snap)] == ["resolved"]


def test_loss_is_nan_from_values_and_from_events():
    evaluator = AlertEvaluator([parse_rule("loss is nan")])
    snap = JobSnapshot(metrics={"loss": [(1.0, 0, 0.5), (1.0, 1, 0.6)]})
    assert evaluator.evaluate(1, snap) == []
    snap.metrics["loss"] += [(2.0, 1, math.nan)]
    fired = evaluator.evaluate(2, snap)
    assert [tr.kind for tr in fired] == ["fired"] and fired[0].detail["ranks"] == ["rank 1"]
    snap.metrics["loss"] += [(3.0, 1, math.inf)]
    assert evaluator.evaluate(3, snap) == []
    snap.metrics["loss"] += [(4.0, 1, 0.4)]
    assert [tr.kind for tr in evaluator.evaluate(4, snap)] == ["resolved"]
    # The runtime reports a "nan" event instead of the value: that counts too.
    snap.nan_events.append((5.0, 0, "loss"))
    assert [tr.kind for tr in evaluator.evaluate(5, snap)] == ["fired"]
    snap.nan_events.append((5.5, 0, "grad_norm"))
    assert evaluator.evaluate(6, snap) == []


def test_loss_is_nan_judges_each_series_by_its_latest_point_of_a_look():
    """Within one look, a series' latest point decides (the last logged on equal times),
    whatever came before it, for thousands of series at once."""
    evaluator = AlertEvaluator([parse_rule("loss is nan")])
    ranks = range(2048)
    # Every rank: a NaN, then a finite value later in the same look; rank 7 the other way
    # round, and rank 9 logs a finite value then a NaN at the same time.
    points = [(1.0, r, math.nan) for r in ranks] + [(2.0, r, 0.5) for r in ranks if r != 7]
    points += [(0.5, 7, 0.5), (1.5, 7, math.nan), (3.0, 9, 0.25), (3.0, 9, math.nan)]
    fired = evaluator.evaluate(3, JobSnapshot(metrics={"loss": points}))
    assert [tr.kind for tr in fired] == ["fired"]
    assert fired[0].detail["ranks"] == ["rank 7", "rank 9"]
    # Seen points are not judged again; a later finite value on each clears the alert.
    later = JobSnapshot(metrics={"loss": points + [(4.0, 7, 0.1), (4.0, 9, 0.1)]})
    assert [tr.kind for tr in evaluator.evaluate(4, later)] == ["resolved"]


def test_no_progress_for_15m():
    evaluator = AlertEvaluator([parse_rule("no progress for 15m")])
    snap = JobSnapshot(started=0.0)
    assert evaluator.evaluate(899, snap) == []
    fired = evaluator.evaluate(900, snap)
    assert [tr.kind for tr in fired] == ["fired"] and "no step yet" in fired[0].message
    assert evaluator.evaluate(1200, snap) == []
    snap.last_progress = 1210.0
    assert [tr.kind for tr in evaluator.evaluate(1215, snap)] == ["resolved"]
    assert evaluator.evaluate(2000, snap) == []
    assert [tr.kind for tr in evaluator.evaluate(2110, snap)] == ["fired"]  # a new episode


def _sync_points(values, rank=0):
    return [(float(i), rank, v) for i, v in enumerate(values)]


def test_baseline_needs_k_consecutive_values():
    rule = parse_rule("grad_sync_ms > 2x baseline 3 times")
    # Warm-up outliers in the first window do not move the median baseline (10 ms).
    base = [50, 10, 10, 11, 9, 10, 10, 10, 12, 10][:BASELINE_WINDOW]
    evaluator = AlertEvaluator([rule])
    two_high = _sync_points(base + [25, 25, 10, 25, 25, 10, 19])
    # Whatever the tick rate and however much the windows overlap, 2 in a row never fire.
    assert _ticks(evaluator, two_high, "grad_sync_ms", until=len(two_high), step=1, window=8) == []
    evaluator = AlertEvaluator([rule])
    points = _sync_points(base + [25, 30, 21, 40, 10, 10])
    transitions = _ticks(evaluator, points, "grad_sync_ms", until=len(points), step=1, window=8)
    assert [(t, tr.kind) for t, tr in transitions] == [(12, "fired"), (14, "resolved")]
    assert transitions[0][1].detail["baseline"] == 10


def test_log_matches_fires_once_per_episode():
    evaluator = AlertEvaluator([parse_rule("log matches /CUDA out of memory/ -> stop")])
    assert evaluator.evaluate(10, JobSnapshot(log_lines=[(9.0, 0, "step 1")])) == []
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    fired = evaluator.evaluate(20, JobSnapshot(log_lines=[(19.0, 3, line), (19.5, 1, line)]))
    assert [tr.kind for tr in fired] == ["fired"]
    assert fired[0].detail["rank"] == 3 and fired[0].rule.action == "stop"
    assert evaluator.evaluate(30, JobSnapshot(log_lines=[(29.0, 2, line)])) == []
    assert evaluator.evaluate(29 + LOG_QUIET_SECONDS - 1, JobSnapshot()) == []
    assert [tr.kind for tr in evaluator.evaluate(29 + LOG_QUIET_SECONDS, JobSnapshot())] == ["resolved"]


def test_state_round_trip_across_a_launcher_restart():
    rules = rules_for(["grad_sync_ms > 2x baseline 3 times"], True)
    first = AlertEvaluator(rules)
    gpu = _gpu_series(0, 10_000, 3000)
    sync = _sync_points([10] * 10 + [30, 30])
    before = _ticks(first, gpu, "gpu_util", until=600)
    assert before == []
    first.evaluate(600, JobSnapshot(metrics={"grad_sync_ms": sync}, started=0.0, last_progress=590.0))
    # What the launcher writes to its store and reads back (slices of 8 entries: many calls)
    saved = wirejson.loads(wirejson.dumps_in_slices(first.state(), 8))

    second = AlertEvaluator(rules_for(["grad_sync_ms > 2x baseline 3 times"], True))
    second.load_state(saved)
    # The low-GPU run started at t=0 continues: it fires at 15 minutes, not 15 after restart.
    after = _ticks(second, gpu, "gpu_util", until=960, start=610, last_progress=955.0, started=0.0)
    assert [(t, tr.kind, tr.rule.kind) for t, tr in after] == [(900, "fired", "threshold")]
    # Re-sent points are not recounted; one more high value makes three.
    snap = JobSnapshot(metrics={"grad_sync_ms": sync}, last_progress=960.0)
    assert second.evaluate(970, snap) == []
    snap.metrics["grad_sync_ms"] = sync + [(12.0, 0, 31.0)]
    assert [tr.kind for tr in second.evaluate(971, snap)] == ["fired"]

    # An episode open at restart is neither re-fired nor forgotten.
    third = AlertEvaluator(rules)
    third.load_state(json.loads(json.dumps(second.state())))
    assert _ticks(third, gpu, "gpu_util", until=1000, start=980, last_progress=990.0) == []
    high = [(1000.0 + i, 0, 0.9, "gpu0") for i in range(3)]
    assert [tr.kind for tr in third.evaluate(1003, JobSnapshot(metrics={"gpu_util": high},
                                                               last_progress=1000.0))] == ["resolved"]
    assert [a["active"] for a in third.active() if a["condition"].startswith("grad_sync")] == [True]


# ------------------------------------------------------------- the state as stored

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=6) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3) | st.integers(-3, 3) | st.booleans() | st.none(), inner, max_size=6),
    max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(1, 12))
def test_a_state_encoded_in_slices_is_json_dumps_text(document, entries):
    """The same text as one json.dumps call (NaN, infinities, keys json turns into strings,
    tuples), whatever the slice size."""
    assert wirejson.dumps_in_slices(document, entries) == json.dumps(document)


def test_no_call_encodes_more_than_a_slice_of_a_4096_rank_state(monkeypatch):
    """The evaluator's state of a 4,096-rank job as the launcher saves it: each json.dumps
    call (each a hold of the GIL) encodes at most one slice's entries."""
    evaluator = AlertEvaluator(rules_for(["loss is nan", "samples_per_s < 0.5x baseline 5 times"], True))
    ranks = [(1000.0 + r * 1e-3, r, 2.5) for r in range(4096)]
    evaluator.evaluate(1001, JobSnapshot(metrics={"loss": ranks, "samples_per_s": ranks},
                                         started=0.0, last_progress=1000.0))
    state = {"evaluator": evaluator.state(), "alerts": evaluator.active(), "stragglers": []}
    whole = json.dumps(state)
    assert len(whole) > 300_000
    sizes = []
    real = json.dumps

    def counted(value, *args, **kwargs):
        sizes.append(wirejson._entries(value, 1 << 30))
        return real(value, *args, **kwargs)

    monkeypatch.setattr(wirejson.json, "dumps", counted)
    assert wirejson.dumps_in_slices(state) == whole
    assert len(sizes) > 20 and max(sizes) <= wirejson.SLICE_ENTRIES


def test_views_read_the_alert_summary_and_an_older_data_dir_its_state(tmp_path):
    """A view reads the open episodes and the stragglers from the small summary saved beside
    the state; a job whose state an older launcher saved (no summary) is read from the state."""
    store = Store(str(tmp_path / "launcher.sqlite"))
    store.insert_job("job-a", "a", {"script": "x"}, "token", str(tmp_path))
    assert store.alert_summary(store.job_row("job-a")) == {"alerts": [], "stragglers": []}
    named = [{"key": "rank 3", "message": "rank 3: input-bound"}]
    old = {"evaluator": {"r": {"cursor": {f"rank {i}": 1.0 for i in range(5000)}}},
           "alerts": [{"condition": "loss is nan", "active": True}], "stragglers": named}
    store.update_job("job-a", alert_state=json.dumps(old))
    assert store.alert_summary(store.job_row("job-a")) == {"alerts": old["alerts"], "stragglers": named}
    store.update_job("job-a", alert_summary=json.dumps({"alerts": [], "stragglers": named[:0]}))
    for row in (store.job_row("job-a"), store.job_rows()[0]):
        assert store.alert_summary(row) == {"alerts": [], "stragglers": []}  # the summary wins


# ---------------------------------------------------------------------------- webhooks

class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        status, answer = self.server.answers.get(self.path, (200, b'{"errcode": 0, "errmsg": "ok"}'))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def hook_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received, server.answers = [], {}
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _payload():
    evaluator = AlertEvaluator([parse_rule("loss is nan -> webhook http://127.0.0.1:9/x")])
    fired = evaluator.evaluate(5, JobSnapshot(metrics={"loss": [(5.0, 2, math.nan)]}))[0]
    return fired.payload(job_id="abc123", job_name="llama-sft")


@pytest.mark.parametrize("url, style", [
    ("https://oapi.dingtalk.com/robot/send?access_token=T", "dingtalk"),
    ("https://open.feishu.cn/open-apis/bot/v2/hook/X", "feishu"),
    ("https://open.larksuite.com/open-apis/bot/v2/hook/X", "feishu"),
    ("https://hooks.slack.com/services/A/B/C", "slack"),
    ("http://alerts.internal:8080/dlc", "generic"),
])
def test_webhook_style_from_host(url, style):
    assert webhook_style(url) == style


@pytest.mark.parametrize("style, check", [
    ("dingtalk", lambda b: b["msgtype"] == "text" and "loss is nan" in b["text"]["content"]),
    ("feishu", lambda b: b["msg_type"] == "text" and "loss is nan" in b["content"]["text"]),
    ("slack", lambda b: set(b) == {"text"} and "loss is nan" in b["text"]),
    ("generic", lambda b: "loss is nan" in b["text"] and b["alert"]["detail"]["ranks"] == ["rank 2"]),
])
def test_post_webhook_each_style_for_real(hook_server, style, check):
    server, base = hook_server
    ok, detail = post_webhook(f"{base}/hook/{style}", _payload(), style=style)
    assert (ok, detail) == (True, "HTTP 200")
    path, content_type, body = server.received[-1]
    assert path == f"/hook/{style}" and content_type.startswith("application/json")
    assert check(body), body
    text = json.dumps(body)
    assert "jupyter-dlc" in text and "llama-sft" in text  # DingTalk keyword, and which job


def test_webhook_body_by_url_without_override():
    url = "https://oapi.dingtalk.com/robot/send?access_token=T"
    assert set(webhook_body(url, _payload())) == {"msgtype", "text"}


def test_post_webhook_failures_are_reported_not_raised(hook_server):
    server, base = hook_server
    server.answers["/refused"] = (200, b'{"errcode": 310000, "errmsg": "keywords not in content"}')
    server.answers["/broken"] = (500, b"oops")
    ok, detail = post_webhook(f"{base}/refused", _payload(), style="dingtalk")
    assert not ok and "310000" in detail
    ok, detail = post_webhook(f"{base}/broken", _payload())
    assert not ok and detail.startswith("HTTP 500")
    ok, detail = post_webhook("http://127.0.0.1:9/hook", _payload(), timeout=2)
    assert not ok and "127.0.0.1:9" in detail
    ok, detail = post_webhook("not a url", _payload())
    assert not ok


def test_a_large_job_has_its_rank_logs_read_in_turns_and_no_line_is_missed(tmp_path):
    """With more ranks than one look reads (LOGS_PER_LOOK), each evaluation reads the next
    ranks' logs, through the engine's `logs` as the alert rules do: every rank's new lines
    arrive within a few looks, exactly once."""
    from jupyter_dlc import layout
    from jupyter_dlc.engines.contract import AttemptContext, get_engine
    from jupyter_dlc.launcher.alerting import LOGS_PER_LOOK, _log_turn
    from jupyter_dlc.spec import JobSpec

    world = 2 * LOGS_PER_LOOK + 100
    attempt_dir = str(tmp_path)
    for rank in range(world):
        path = layout.rank_log(attempt_dir, rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"rank {rank} line 1\n")
    ctx = AttemptContext("J", 1, JobSpec(name="t", code="x", nodes=1, nproc_per_node=world),
                         str(tmp_path), attempt_dir, "", {}, 0)
    engine = get_engine("local")
    offsets: dict[str, int] = {}

    def look(turn: int) -> list[tuple[int, str]]:
        lines = []
        for rank in _log_turn(world, turn):
            text, offsets[str(rank)] = engine.logs(ctx, {}, rank, offsets.get(str(rank), 0))
            lines += [(rank, line) for line in text]
        return lines

    looks = [look(turn) for turn in range(1, 4)]
    assert all(len(lines) <= LOGS_PER_LOOK for lines in looks)
    seen = [rank for lines in looks for rank, _text in lines]
    assert sorted(seen) == list(range(world))
    assert look(4) == []  # nothing new: nothing again
    with open(layout.rank_log(attempt_dir, world - 1), "a") as f:
        f.write("CUDA out of memory\n")
    later = [line for turn in range(5, 8) for line in look(turn)]
    assert later == [(world - 1, "CUDA out of memory")]


def test_webhooks_go_through_one_bounded_executor_and_idle_jobs_are_forgotten(tmp_path):
    """A real HTTP receiver on loopback that holds every POST until released, a real store:
    an alert storm past the workers and the backlog is not sent (an event says so each
    time), what was taken is delivered once released, and no thread is started per webhook.
    A job not evaluated for FORGET_AFTER leaves the evaluator's memory (its state is in the
    store)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from conftest import wait_for
    from jupyter_dlc.launcher import alerting
    from jupyter_dlc.launcher.store import Store

    release, arrived = threading.Event(), []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.append(1)
            release.wait(30)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    store = Store(str(tmp_path / "launcher.sqlite"))
    store.insert_job("j1", "storm", {"script": "x.py"}, "token", str(tmp_path))
    hooks = alerting.Alerting(SimpleNamespace(store=store))
    taken = alerting.WEBHOOK_WORKERS + alerting.WEBHOOK_BACKLOG
    try:
        for i in range(taken + 3):
            hooks.send_webhook("j1", 1, url, {"n": i})
        refused = [e for e in store.events("j1") if e["type"] == "webhook"]
        assert len(refused) == 3 and all("webhook not sent" in e["reason"] for e in refused), refused
        wait_for(lambda: len(arrived) == alerting.WEBHOOK_WORKERS, 10, what="the workers' POSTs")
        senders = [t for t in threading.enumerate() if t.name.startswith("dlc-webhook")]
        assert len(senders) == alerting.WEBHOOK_WORKERS, senders
        release.set()
        wait_for(lambda: len([e for e in store.events("j1") if (e["data"] or {}).get("ok")]) == taken, 30,
                 what="every webhook taken delivered")
        assert len(arrived) == taken
    finally:
        release.set()
        hooks.close()
        server.shutdown()

    forgotten = alerting.JobAlerts({"script": "x.py"}, None)
    kept = alerting.JobAlerts({"script": "x.py"}, None)
    forgotten.last_run, kept.last_run = 1000.0, 1000.0 + alerting.FORGET_AFTER
    hooks.jobs.update(old=forgotten, recent=kept)
    hooks(None, 1001.0 + alerting.FORGET_AFTER)
    assert list(hooks.jobs) == ["recent"]


def test_throughput_windows_from_the_launchers_environment():
    from jupyter_dlc.launcher.alerts import THROUGHPUT_DEFAULTS, throughput_windows

    assert throughput_windows(None) == THROUGHPUT_DEFAULTS == (30.0, 60.0, 180.0)
    assert throughput_windows("2,1,4") == (2.0, 1.0, 4.0)
    for bad in ("2,1", "a,b,c", "2,0,4", "2,1,inf", "2;1;4"):
        with pytest.raises(SpecError, match=r"^DLC_THROUGHPUT_WINDOWS: .* is not three positive numbers"):
            throughput_windows(bad)
