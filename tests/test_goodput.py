"""The goodput ledger (launcher/goodput.py) of a real 2x2 torchrun job whose parts the script
knows: each step waits 20 ms for its input and computes ~30 ms, a checkpoint at step 100,
kill -9 of rank 3 at step 150, a restart from step 100. The script writes its own timestamps;
the ledger's lost work, restart downtime and data wait must each be within 10% of what they
say, and its goodput within 3 points. One job for the module."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import urllib.error
import urllib.request
from contextlib import redirect_stdout

import pytest
from conftest import wait_for

from jupyter_dlc import cli, formatting
from jupyter_dlc.client import LauncherError
from jupyter_dlc.spec import JOB_OPTIONS, JobSpec, SpecError, spec_from_options
from jupyter_dlc.widgets import JobView

TOTAL = 170

TRAIN = """
import json, os, signal, time
import torch, torch.distributed as dist
from jupyter_dlc import runtime

total = %d
info = runtime.init(total_steps=total)
model = torch.nn.Linear(4, 1)
ckpt = runtime.Checkpointer(model=model)
step = ckpt.restore()
attempt = int(os.environ["DLC_ATTEMPT"])
truth = open(os.path.join(os.environ["DLC_JOB_DIR"], f"truth-{info.rank}-{attempt}.jsonl"), "a",
             buffering=1)
stall = 0.0
while step < total:
    t0 = time.time()
    time.sleep(0.02)                      # waiting for the batch
    wait = time.time() - t0
    time.sleep(0.03)                      # compute
    dist.all_reduce(torch.ones(1))
    step += 1
    # The step's end as the script sees it: when it logs it (the runtime stamps it then too).
    truth.write(json.dumps({"step": step, "t": time.time(), "wait": wait, "stall": stall}) + "\\n")
    runtime.log(step, loss=1.0 / step, data_wait_ms=wait * 1000, ckpt_stall_ms=stall * 1000)
    stall = 0.0
    if step == 100:
        began = time.time()
        ckpt.save(step)
        stall = time.time() - began       # logged with the next step, whose time it took
    if step == 150 and attempt == 1 and info.rank == 3:
        truth.write(json.dumps({"killed": time.time()}) + "\\n")
        truth.close()
        runtime.shutdown()                # this rank's step 150 reaches the launcher
        os.kill(os.getpid(), signal.SIGKILL)
truth.close()
""" % TOTAL


@pytest.fixture(scope="module")
def faulted(shared_launcher):
    """The job, seen running its second attempt (for `status`), then as it ended."""
    client = shared_launcher.client
    job = client.submit({"script": shared_launcher.script("train.py", TRAIN), "nodes": 2,
                         "nproc_per_node": 2, "max_restarts": 1, "heartbeat_interval": 1})
    def second_attempt_past(step: int) -> bool:
        detail = client.job(job["id"])
        return detail["attempt"] == 2 and any((r["last_step"] or 0) > step for r in detail["ranks"])
    wait_for(lambda: second_attempt_past(110), 120, what="attempt 2 past step 110")
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["status", job["id"]]) == 0
    view = JobView(client, job["id"])  # the notebook view, in process: the test refreshes it
    view.refresh_now()
    running_header = view.header.value
    ended = client.wait(job["id"], timeout=120)
    assert ended["state"] == "SUCCEEDED", ended["reason"]
    view.refresh_now()
    return shared_launcher, ended, out.getvalue(), running_header, view


def _truth(job_dir: str, rank: int, attempt: int) -> list[dict]:
    with open(os.path.join(job_dir, f"truth-{rank}-{attempt}.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_the_ledger_matches_what_the_script_knows(faulted):
    launcher, job, *_ = faulted
    ledger = launcher.client.goodput(job["id"])
    first, second = _truth(job["job_dir"], 0, 1), _truth(job["job_dir"], 0, 2)
    failed = next(r["killed"] for r in _truth(job["job_dir"], 3, 1) if "killed" in r)
    at = {r["step"]: r for r in first}
    assert second[0]["step"] == 101  # restored from step 100
    kept = [r for r in first if r["step"] <= 100]
    lost = failed - at[100]["t"]
    downtime = second[0]["t"] - failed
    # Each attempt's first step is start-up; the rest of the kept steps are the breakdown.
    data_wait = sum(r["wait"] for r in kept[1:] + second[1:])
    productive = sum(b["t"] - a["t"] - b["wait"] - b["stall"]
                     for steps in (kept, second) for a, b in zip(steps, steps[1:], strict=False))
    wall = job["ended"] - job["created"]
    parts = ledger["parts"]
    assert abs(parts["lost_work"] - lost) <= 0.1 * lost, (parts, lost)
    assert abs(parts["restart_downtime"] - downtime) <= 0.1 * downtime, (parts, downtime)
    assert abs(parts["data_wait"] - data_wait) <= 0.1 * data_wait, (parts, data_wait)
    assert abs(ledger["goodput"] - productive / wall) <= 0.03, (ledger, productive / wall)
    assert abs(sum(parts.values()) - ledger["wall_seconds"]) < 1e-6
    assert abs(ledger["wall_seconds"] - wall) < 1e-6
    assert parts["startup"] > 1 and parts["hung"] == 0 and parts["stopped"] == 0
    assert ledger["steps_counted"] == len(kept) - 1 + len(second) - 1
    # The summary (list, stream) carries the ratio; /metrics has the gauges.
    listed = next(j for j in launcher.client.jobs() if j["id"] == job["id"])
    assert abs(listed["goodput"] - ledger["goodput"]) < 1e-3
    assert listed["progress"]["total_steps"] == TOTAL and listed["progress"]["eta_seconds"] is None
    table = formatting.jobs_table([listed])
    assert "GOODPUT" in table and formatting.percent(ledger["goodput"]) in table
    assert f"{TOTAL}/{TOTAL}" in table
    client = launcher.client
    request = urllib.request.Request(client.url + "/metrics",
                                     headers={"Authorization": f"token {client.token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    assert f'dlc_job_goodput_ratio{{job="{job["id"]}"}}' in text
    assert f'dlc_job_time_seconds{{job="{job["id"]}",part="lost_work"}}' in text


def test_status_shows_progress_with_an_eta_and_the_goodput_line(faulted):
    _, _, status, header, _ = faulted
    first = status.splitlines()[0]
    assert f" / {TOTAL}, ETA " in first and " s, loss " in first, status
    assert "goodput " in status and "restart downtime" in status and "lost work" in status


def test_the_notebook_view_shows_progress_and_the_goodput_bar(faulted):
    launcher, job, _, header, view = faulted
    assert re.search(r'class="dlc-step">1[1-6]\d</b> / <span class="dlc-progress">170, ETA \d+ s<', header), header
    ledger = launcher.client.goodput(job["id"])
    bar = view.goodput_bar.value
    assert f'class="dlc-goodput-value">{formatting.percent(ledger["goodput"])}<' in bar
    drawn = dict(re.findall(r'data-part="(\w+)"[^>]*width:([\d.]+)%', bar))
    assert {"productive", "data_wait", "lost_work", "restart_downtime", "startup"} <= set(drawn)
    assert abs(float(drawn["lost_work"]) - 100 * ledger["parts"]["lost_work"] / ledger["wall_seconds"]) < 0.01
    assert abs(sum(map(float, drawn.values())) - 100) < 0.1


def test_the_goodput_route_checks_the_token_and_the_id(faulted):
    launcher, job, *_ = faulted
    client = launcher.client
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{client.url}/api/jobs/{job['id']}/goodput", timeout=5)
    assert refused.value.code == 401
    with pytest.raises(LauncherError) as missing:
        client.goodput("no-such-job")
    assert missing.value.status == 404 and str(missing.value).startswith("job: no job")


def test_steps_is_a_job_option_checked_in_the_spec():
    parser = argparse.ArgumentParser()
    for flags, kwargs in JOB_OPTIONS:  # what %%dlc and `jupyter-dlc run` declare
        parser.add_argument(*flags, **kwargs)
    assert spec_from_options(parser.parse_args(["--steps", "400"]), code="x = 1").steps == 400
    assert spec_from_options(parser.parse_args([]), code="x = 1").steps is None
    assert JobSpec.from_dict({"code": "pass", "steps": 400}).steps == 400
    with pytest.raises(SpecError, match="^steps: must be between 1 and"):
        JobSpec.from_dict({"code": "pass", "steps": 0})


def test_a_hang_a_restore_and_a_restart_each_go_to_their_part(tmp_path):
    """The ledger's walk over a timeline of known times (a store of its own, no job): a
    look while attempt 1 runs, then one after it hung, was restarted from step 2 and
    succeeded, read incrementally by the same ledger."""
    from jupyter_dlc.launcher.goodput import Ledger
    from jupyter_dlc.launcher.store import Store

    store = Store(str(tmp_path / "store.sqlite"))
    store.insert_job("j", "j", {"nodes": 1, "nproc_per_node": 1}, "token", str(tmp_path))
    db = store.db
    db.execute("UPDATE jobs SET created = 0")
    db.execute("DELETE FROM events")

    def state(attempt: int, t: float, name: str) -> None:
        db.execute("INSERT INTO events (job_id, t, attempt, type, state, reason) VALUES"
                   " ('j', ?, ?, 'state', ?, '')", (t, attempt, name))
        db.execute("UPDATE jobs SET state = ?, attempt = ? WHERE id = 'j'", (name, attempt))

    def steps(attempt: int, *at: tuple[int, float]) -> None:
        for step, t in at:
            store.record_report("j", attempt, {"rank": 0, "metrics": [
                {"t": t, "step": step, "values": {"loss": 1.0, "data_wait_ms": 200.0}}]})

    for t, name in ((0, "QUEUED"), (1, "PREFLIGHT"), (2, "STARTING"), (3, "RUNNING")):
        state(1, t, name)
    db.execute("UPDATE attempts SET started = 2 WHERE attempt = 1")
    steps(1, (1, 5), (2, 6), (3, 7), (4, 8))
    ledger = Ledger(store)
    running = ledger.ledger(store.job_row("j"), now=9)
    assert _rounded(running["parts"]) == {"waiting": 2, "startup": 3, "productive": 3.4, "data_wait": 0.6}
    assert running["progress"]["steps_per_second"] == 1.0

    db.execute("UPDATE attempts SET outcome = 'failed', failure = ? WHERE attempt = 1",
               (json.dumps({"class": "hang"}),))
    state(1, 20, "RESTARTING")
    db.execute("INSERT INTO attempts (job_id, attempt, state, started, resume_path) VALUES"
               " ('j', 2, 'QUEUED', 22, '/ckpt/step-2')")
    for t, name in ((21, "QUEUED"), (22, "STARTING")):
        state(2, t, name)
    steps(2, (3, 30), (4, 31), (5, 32))
    state(2, 33, "SUCCEEDED")
    db.execute("UPDATE jobs SET ended = 33 WHERE id = 'j'")
    ended = ledger.ledger(store.job_row("j"), now=50)
    assert _rounded(ended["parts"]) == {
        "waiting": 2, "startup": 3, "productive": 2.4, "data_wait": 0.6,  # 0.8 + 1.6, 0.2 + 0.4
        "lost_work": 2, "hung": 12, "restart_downtime": 1 + 9, "shutdown": 1}
    assert ended["wall_seconds"] == 33 and round(ended["goodput"], 6) == round(2.4 / 33, 6)
    assert ended["steps_counted"] == 1 + 2


def _rounded(parts: dict) -> dict:
    return {k: round(v, 6) for k, v in parts.items() if v}
