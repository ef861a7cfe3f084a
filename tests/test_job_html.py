"""The job view's renderers (widgets/job_html.py) and what it keeps of a job
(widgets/followed_job.py), on their own: no widget, no launcher. What the view shows of a real
job is tested in test_widgets.py and test_view_escaping.py; here the cases a real job does not
reach easily (a stored value holding markup in every field, banners in their order, pages)."""

from __future__ import annotations

import re

from jupyter_dlc.widgets import job_html
from jupyter_dlc.widgets.followed_job import FollowedJob

PAYLOAD = '<img src=x onerror="alert(1)">'
ESCAPED = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"


def _job(**fields) -> dict:
    job = {"id": "j1", "state": "RUNNING", "attempt": 1, "created": 1.0, "ended": 61.0}
    job.update(fields)
    return job


def test_header_escapes_every_stored_value():
    job = _job(state="FAILED", last_step=PAYLOAD, last_loss=PAYLOAD, reason=PAYLOAD, storage=PAYLOAD,
               last_checkpoint={"step": PAYLOAD, "time": PAYLOAD}, parent={"job": PAYLOAD, "step": 3})
    text = job_html.header_html("j1", job, note=PAYLOAD)
    assert "<img" not in text
    # step, loss, checkpoint step, parent, note, storage, reason
    assert text.count(ESCAPED) == 7, text
    assert 'data-state="FAILED"' in text and "#c62828" in text


def test_header_rates_and_progress():
    job = _job(last_step=256, last_loss=0.5, progress={"step": 256, "total_steps": 400})
    text = job_html.header_html("j1", job, steps_per_s=2.25, samples_per_s=1280.0)
    assert 'step <b class="dlc-step">256</b> / <span class="dlc-progress">400' in text
    assert 'loss <b class="dlc-loss">0.5</b>' in text
    assert "2.2 steps/s ·" in text and "1,280 samples/s (sum over ranks)" in text
    assert "no checkpoint yet" in text
    ended = job_html.header_html("j1", _job(state="SUCCEEDED"), steps_per_s=2.0)
    assert "2.0 steps/s (at the end)" in ended
    assert job_html.header_html("j<1>", None) == "<b>j&lt;1&gt;</b>: waiting for the launcher"


def test_ranks_table_and_pages():
    ranks = [{"node": 0, "rank": 0, "state": PAYLOAD, "last_step": None, "exit_code": None},
             {"node": 1, "rank": 1, "state": "FAILED", "last_step": 7, "exit_code": 3}]
    table = job_html.ranks_html(ranks)
    assert "<img" not in table and ESCAPED in table
    assert re.findall(r'data-rank="(\d)" style="color:([^"]+)"', table) == [("0", "inherit"), ("1", "#c62828")]
    assert job_html.ranks_html([]).startswith('<div class="dlc-ranks"')
    assert "ranks 51-100 of 4096 · page 2 of 82" in job_html.rank_pages_html(1, 50, 4096, 82)


def test_banners_in_order_and_escaped():
    text = job_html.banner_html(
        "j1", down="refused", retry_every=2, gone=PAYLOAD,
        alerts=[{"data": {"message": PAYLOAD, "rule": "loss > 3"}}],
        stragglers=[{"key": "rank 3"}],
        evidence=[{"attempt": 1, "reason": "old"}, {"attempt": 2, "reason": "hang", "data": {"dir": "/e"}}],
        diagnoses=[{"attempt": 1, "class": "first"}, {"attempt": 2, "class": "second"},
                   {"attempt": 3, "class": "oom", "rank": 1, "node": 0, "line": PAYLOAD, "suggestion": "less"}])
    kinds = re.findall(r'class="dlc-banner dlc-banner-(\w+)"', text)
    assert kinds == ["launcher", "job", "alert", "straggler", "evidence", "diagnosis", "diagnosis"]
    assert "retrying every 2s" in text and "(rule: loss &gt; 3)" in text
    assert "attempt 2: hang in /e (`%dlc evidence j1` lists it)" in text and "attempt 1: old" not in text
    # the last two diagnoses, newest first
    assert text.index("attempt 3 failed: oom (rank 1 on node 0)") < text.index("attempt 2 failed: second")
    assert "first" not in text and "— what to do: less" in text
    assert "<img" not in text and text.count(ESCAPED) == 3
    assert job_html.banner_html("j1") == ""


def test_logs_retention_and_goodput():
    assert job_html.logs_html([]).endswith(">(no output yet)</pre>")
    logs = job_html.logs_html([(1, None, "--- attempt 2 ---"), (2, 0, PAYLOAD)])
    assert f"--- attempt 2 ---\n[0] {ESCAPED}</pre>" in logs
    assert job_html.retention_note_html("") == ""
    assert job_html.error_note_html(PAYLOAD) == f'<span style="color:#c62828">{ESCAPED}</span>'
    assert job_html.goodput_bar_html(None) == "" and job_html.goodput_bar_html({"wall_seconds": 0}) == ""
    bar = job_html.goodput_bar_html({"wall_seconds": 100, "goodput": 0.5,
                                     "parts": {"productive": 50, "startup": 30, "hung": 0.2}})
    assert re.findall(r'data-part="(\w+)"', bar) == ["productive", "startup", "hung"]
    assert 'class="dlc-goodput-value">50%<' in bar and "width:50.000%" in bar
    legend = bar.split('<div style="color:#555;font-size:11px">')[1]
    assert "start-up: 30 s (30.0%)" in legend and "hung" not in legend  # under 0.5 s: no legend


def test_followed_job_adds_each_point_once_and_filters_logs():
    f = FollowedJob("j1", world_size=2, capacity=100, log_lines=3)
    points = [{"seq": s, "rank": s % 2, "step": s, "name": "loss", "value": 1.0, "t": float(s)} for s in (1, 2, 3)]
    assert f.add_metrics({"points": points, "last_seq": 3}, since=0).values == 3
    assert f.add_metrics({"points": points[1:], "last_seq": 3}, since=1).values == 0  # seen already
    assert f.metrics_seq == 3
    f.add_logs({"attempt": 1, "lines": [{"rank": 0, "text": "a"}, {"rank": 1, "text": "b"}], "cursor": "c1"})
    f.add_logs({"attempt": 2, "lines": [{"rank": 1, "text": "c"}, {"rank": 0, "text": "d"}]})
    assert f.log_cursor == "c1"
    assert [t for _, _, t in f.logs_of(-1)] == ["--- attempt 2 ---", "c", "d"]  # the last 3
    assert [t for _, _, t in f.logs_of(1)] == ["b", "--- attempt 2 ---", "c"]
    f.add_events([{"seq": 4, "type": "alert", "data": {"rule": "r"}},
                  {"seq": 6, "type": "alert", "data": {"rule": "s"}},
                  {"seq": 5, "type": "alert_resolved", "data": {"rule": "r"}}])
    assert list(f.alerts) == ["s"] and f.events_seq == 6
