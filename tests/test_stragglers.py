"""Stragglers named while a job runs, the performance verdict of `why`, the straggler and
throughput rule forms, and the evidence folder kept before a hung attempt is killed.

The straggler job is real torchrun, 3 nodes x 3 processes (9 ranks, so that one node's three
ranks are a third of the world and the median is the healthy ranks'). Its ranks log the step
breakdown themselves (issue 23's contract: a value the script logs wins), with the numbers a
synchronous job would show, in phases the test switches through a file:

- balanced: every rank ~50 ms of own work with jitter, the all-reduce absorbing the rest;
  logged fast (synthetic steps, 4 ms of sleep each) so many windows pass in a few seconds;
- rank: rank 3 60% slower (80 ms of own work, of it 31 ms data wait), the others wait;
- node: the three ranks of node 2 slower (compute);
- input: every rank waits 300 ms of a 352 ms step for its data (input-bound);
- end.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import wait_for
from jupyter_dlc import formatting
from jupyter_dlc.launcher import alerts, stragglers
from jupyter_dlc.launcher.alerts import AlertEvaluator, JobSnapshot, parse_rule
from jupyter_dlc.spec import SpecError

PHASED = """
import os, random, sys, time
from jupyter_dlc import runtime
runtime.init()
rank = int(os.environ["RANK"])
phase_file = sys.argv[1]
rng = random.Random(rank)
step = 0
phase = "balanced"
while phase != "end":
    step += 1
    if step % 5 == 1:
        with open(phase_file) as f:
            phase = f.read().strip() or phase
    own, data, total, pause = 50 + rng.uniform(-2.5, 2.5), 1 + rng.uniform(0, 0.5), 58, 0.004
    if phase == "rank":
        total, pause = 84, 0.05
        if rank == 3:
            own, data = 80.0, 31.0
    elif phase == "node":
        total, pause = 84, 0.05
        if rank in (6, 7, 8):
            own = 80.0
    elif phase == "input":
        own, data, total, pause = 350.0, 300.0, 352, 0.01
    runtime.log(step, loss=1.0 / step, step_ms=total, grad_sync_ms=total - own,
                data_wait_ms=data, ckpt_stall_ms=0.0)
    time.sleep(pause)
"""


def _set_phase(path: str, phase: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(phase)
    os.replace(path + ".tmp", path)


def _named(client, job_id: str) -> list[str]:
    return [f["key"] for f in client.job(job_id)["stragglers"]]


@pytest.fixture(scope="module", autouse=True)
def short_throughput_windows():
    """The module's launcher judges throughput on 2 s windows, after 1 s, over 4 s (the
    defaults need four minutes of steady state)."""
    saved = os.environ.get("DLC_THROUGHPUT_WINDOWS")
    os.environ["DLC_THROUGHPUT_WINDOWS"] = "2,1,4"
    yield
    if saved is None:
        os.environ.pop("DLC_THROUGHPUT_WINDOWS", None)
    else:
        os.environ["DLC_THROUGHPUT_WINDOWS"] = saved


@pytest.fixture(scope="module")
def hung_job(shared_launcher) -> str:
    """The hung job of the evidence test, submitted first so that it hangs and is judged
    while the straggler job runs (the two share the module's launcher)."""
    script = shared_launcher.script("hangs.py", HANGS)
    return shared_launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                          "heartbeat_interval": 1, "progress_timeout": "5s",
                                          "max_restarts": 0})["id"]


def test_stragglers_named_in_a_real_job_and_the_verdict_of_why(hung_job, shared_launcher, tmp_path):
    launcher, client = shared_launcher, shared_launcher.client
    phase = str(tmp_path / "phase")
    _set_phase(phase, "balanced")
    script = launcher.script("phased.py", PHASED)
    job = client.submit({"script": script, "args": [phase], "nodes": 3, "nproc_per_node": 3,
                         "max_restarts": 0, "alerts": ["straggler for 2s",
                                                       "throughput < 0.5x baseline for 2s"]})
    job_id = job["id"]
    try:
        # Balanced: many windows of steps judged, nobody named; and the throughput baseline
        # taken (its 1 s skip and 4 s span past the first step the launcher saw).
        wait_for(lambda: client.job(job_id)["last_step"], 90, what="a first step")
        first_step_seen = time.time()
        wait_for(lambda: (client.job(job_id)["last_step"] or 0) >= 600
                 and time.time() - first_step_seen > 6, 90, what="600 balanced steps, 6 s")
        assert _named(client, job_id) == []
        answer = client.why(job_id)
        assert answer["verdict"]["verdict"] == "healthy", answer["verdict"]
        assert "what to do" in formatting.diagnosis_text(answer["diagnoses"], client.job(job_id),
                                                         answer["verdict"])

        # One rank 60% slower: named within 10 s, with the reason.
        _set_phase(phase, "rank")
        slowed = time.time()
        found = wait_for(lambda: client.job(job_id)["stragglers"] or None, 10, what="rank 3 named")
        assert [f["key"] for f in found] == ["rank 3"], found
        message = found[0]["message"]
        # Named as its window fills, so its median may still be between 50 and 80 ms.
        assert re.match(r"rank 3 on node 1: \d+ ms of its own work a step against a median of "
                        r"\d+ ms, the others wait \d+ ms in the all-reduce; its data wait is "
                        r"\d+ ms, the others' 1.\d ms: input-bound on that node", message), message
        assert 47 < found[0]["median_ms"] < 53 and found[0]["own_ms"] > 1.2 * found[0]["median_ms"], found
        # `straggler for 2s` (the default's 5m, shortened) fires, naming it.
        fired = wait_for(lambda: [e for e in client.events(job_id) if e["type"] == "alert"
                                  and e["data"]["condition"] == "straggler for 2s"], 15,
                         what="straggler alert")
        assert "rank 3 on node 1" in fired[0]["reason"], fired[0]
        assert client.why(job_id)["verdict"]["verdict"] == "straggler"
        # Its steps come ten times slower (50 ms pauses, not 4 ms): the throughput rule fires.
        slow = wait_for(lambda: [e for e in client.events(job_id) if e["type"] == "alert"
                                 and e["data"]["condition"].startswith("throughput")
                                 and e["t"] > slowed], 20, what="throughput alert")
        assert re.search(r"steps/s, < 0.5x the baseline [\d.]+ steps/s for \d+s", slow[0]["reason"]), slow[0]
        # The notebook view's banner names it (a view not displayed: the widgets' values).
        from jupyter_dlc.widgets import JobView

        view = JobView(client, job_id)
        wait_for(lambda: view.refresh_now() and "dlc-banner-straggler" in view.banner.value, 10,
                 what="straggler banner")
        assert "rank 3 on node 1" in view.banner.value
        view.close()

        # The three ranks of node 2 slow: the node is named.
        _set_phase(phase, "node")
        found = wait_for(lambda: [f for f in client.job(job_id)["stragglers"] if f["key"] == "node 2"]
                         or None, 10, what="node 2 named")
        assert found[0]["ranks"] == [6, 7, 8] and "compute-bound" in found[0]["message"], found

        _set_phase(phase, "input")
        wait_for(lambda: client.why(job_id)["verdict"]["verdict"] == "input-bound", 20,
                 what="input-bound verdict while running")
        _set_phase(phase, "end")
        final = client.wait(job_id, timeout=60)
        assert final["state"] == "SUCCEEDED", final["reason"]
        assert final["stragglers"] == []
        answer = client.why(job_id)
        assert answer["verdict"]["verdict"] == "input-bound", answer["verdict"]
        assert "DataLoader workers" in answer["verdict"]["suggestion"]
        # The balanced phase named nobody: the first straggler event is rank 3's.
        events = [e for e in client.events(job_id) if e["type"] == "straggler"]
        assert events and events[0]["data"]["stragglers"][0]["key"] == "rank 3", events[:2]
    finally:
        _set_phase(phase, "end")


def _balanced_steps(detector, ranks: int, steps: int, rng: random.Random, judge_every: int) -> list:
    named = []
    for step in range(steps):
        points = []
        for rank in range(ranks):
            own = 50 + rng.gauss(0, 2) + (15 if rng.random() < 0.01 else 0)  # rare spikes
            total = 60 + rng.gauss(0, 1)
            points += [("step_ms", step, rank, total), ("grad_sync_ms", step, rank, max(0.0, total - own)),
                       ("data_wait_ms", step, rank, 1 + rng.random())]
        detector.add(points)
        if step % judge_every == 0:
            named += detector.judge()
    return named


def test_a_balanced_job_names_nobody_in_five_minutes_of_steps():
    """Five minutes of 50 ms steps (6,000 per rank) on 8 ranks, with jitter and rare
    spikes, judged every window: nobody is named. The same detector then names a rank
    made 60% slower within one window."""
    rng = random.Random(7)
    detector = stragglers.StragglerDetector(8, 4)
    assert _balanced_steps(detector, 8, 6000, rng, stragglers.WINDOW) == []
    for step in range(6000, 6000 + stragglers.WINDOW):
        points = []
        for rank in range(8):
            own = 80.0 if rank == 5 else 50 + rng.gauss(0, 2)
            points += [("step_ms", step, rank, 84.0), ("grad_sync_ms", step, rank, 84.0 - own)]
        detector.add(points)
    found = detector.judge()
    assert [f["key"] for f in found] == ["rank 5"] and found[0]["bound"] == "compute", found


def test_the_rule_forms_parse_and_bad_forms_name_the_field():
    rule = parse_rule("straggler for 5m")
    assert rule.kind == "straggler" and rule.duration == 300 and rule.condition == "straggler for 5m"
    rule = parse_rule("throughput < 0.5x baseline for 5m -> webhook http://127.0.0.1:1/h")
    assert (rule.kind, rule.op, rule.factor, rule.duration, rule.action) == \
        ("throughput", "<", 0.5, 300, "webhook")
    assert rule.condition == "throughput < 0.5x baseline for 5m"
    assert "straggler for 5m -> notify" in [r.key for r in alerts.rules_for([], True)]
    for text, expected in (("straggler 5m", "expected 'for'"),
                           ("straggler for soon", "expected a duration"),
                           ("throughput < 0.5x baseline 3 times", "expected 'for DURATION'"),
                           ("straggler for 5m -> page", "expected an action")):
        with pytest.raises(SpecError) as error:
            parse_rule(text)
        line = str(error.value)
        assert line.startswith("alerts: ") and expected in line and "\n" not in line, line


def test_throughput_rule_fires_below_its_baseline(monkeypatch):
    monkeypatch.setattr(alerts, "BASELINE_SKIP", 2.0)
    monkeypatch.setattr(alerts, "BASELINE_SPAN", 4.0)
    monkeypatch.setattr(alerts, "THROUGHPUT_WINDOW", 2.0)
    evaluator = AlertEvaluator([parse_rule("throughput < 0.5x baseline for 3s")])
    step, fired = 0.0, []
    for tick in range(60):  # 10 steps/s for 15 s, then 3 steps/s
        t = tick * 0.5
        step += 5 if t < 15 else 1.5
        fired += evaluator.evaluate(t, JobSnapshot(progress=(t, int(step), 1)))
    assert [tr.kind for tr in fired] == ["fired"], fired
    assert "baseline 10 steps/s" in fired[0].message, fired[0].message


HANGS = """
import os, sys, time
import torch.distributed as dist
from jupyter_dlc import runtime
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 10_000):
    if rank == 1 and step == 4:
        print("rank 1 about to wait for ever", flush=True)
        time.sleep(3600)
    dist.barrier()
    print(f"step {step} done", flush=True)
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.05)
"""


def test_a_hung_job_keeps_its_evidence_and_the_cli_lists_it(hung_job, shared_launcher):
    client = shared_launcher.client
    job = {"id": hung_job}
    final = client.wait(job["id"], timeout=120)
    assert final["state"] == "FAILED" and "hang" in final["reason"], final["reason"]
    [folder] = client.evidence(job["id"])
    names = {f["name"] for f in folder["files"]}
    assert {f"stacks-rank-{r}.txt" for r in range(2)} <= names, names
    assert "logs-tail.txt" in names
    with open(os.path.join(folder["dir"], "stacks-rank-1.txt")) as f:
        assert "time.sleep(3600)" in f.read()
    # Native stacks too (py-spy, a test extra): the interpreter's C frames under the sleep.
    assert {f"native-rank-{r}.txt" for r in range(2)} <= names, (names, folder.get("skipped"))
    with open(os.path.join(folder["dir"], "native-rank-1.txt")) as f:
        native = f.read()
    assert "time_sleep" in native and "script.py" in native, native
    with open(os.path.join(folder["dir"], "logs-tail.txt")) as f:
        tail = f.read()
    assert "rank 1 about to wait for ever" in tail and "step 3 done" in tail, tail
    from jupyter_dlc.widgets import JobView

    view = JobView(client, job["id"])
    wait_for(lambda: view.refresh_now() and "dlc-banner-evidence" in view.banner.value, 10,
             what="evidence banner")
    assert folder["dir"] in view.banner.value, view.banner.value
    view.close()
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "evidence", job["id"]],
                         capture_output=True, text=True, timeout=60, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert "stacks-rank-1.txt" in out.stdout and folder["dir"] in out.stdout, out.stdout


def test_a_restarted_launcher_keeps_naming_the_straggler_of_a_slow_stepping_job(tmp_path):
    """A step a minute, rank 3 of 9 slow. The launcher names it, then restarts (new
    in-memory state over the same SQLite store, as a restarted process has): the next two
    steps, fewer than a window needs, must not un-name it ("no straggler any more" and the
    alert episode closed, then named again minutes later). Real store and alert hooks; the
    launcher process is not started: its restart is the new objects reading the saved state,
    and the supervisor's log reader answers no lines (no rule here reads logs)."""
    from types import SimpleNamespace

    from jupyter_dlc.launcher import alerting
    from jupyter_dlc.launcher.store import Store

    store = Store(str(tmp_path / "launcher.sqlite"))
    store.insert_job("j", "slow", {"script": "x.py", "nodes": 3, "nproc_per_node": 3}, "token",
                     str(tmp_path))
    start = time.time() - 3600
    store.update_attempt("j", 1, started=start)
    store.transition("j", "RUNNING", "every rank is up")

    def steps(first: int, count: int) -> list[dict]:
        return [{"rank": rank, "node": rank // 3, "metrics": [
            {"t": start + 60 * step, "step": step,
             "values": {"step_ms": 84.0, "grad_sync_ms": 84.0 - (80.0 if rank == 3 else 50.0 + rank / 10),
                        "data_wait_ms": 1.0, "ckpt_stall_ms": 0.0}}
            for step in range(first, first + count)]} for rank in range(9)]

    def straggler_events() -> list[dict]:
        return [e for e in store.events("j") if e["type"] == "straggler"]

    # Another job of the launcher writes 100 times between two steps of this one: the chunk
    # seqs are shared, so a refill must count back by this job's own writes.
    store.insert_job("k", "busy", {"script": "x.py", "nodes": 1, "nproc_per_node": 1}, "token",
                     str(tmp_path))
    for step in range(1, 13):  # a write a step, as a rank stepping once a minute reports
        store.record_reports([("j", 1, steps(step, 1))])
        store.record_reports([("k", 1, [{"rank": 0, "node": 0, "metrics": [
            {"t": start + 60 * step + i, "step": 100 * step + i, "values": {"loss": 1.0}}]}])
            for i in range(100)])
    supervisor = SimpleNamespace(store=store, logs=lambda *args, **kwargs: [])
    before = alerting.Alerting(supervisor)
    before(store.job_row("j"), time.time())
    [named] = straggler_events()
    assert named["data"]["stragglers"][0]["key"] == "rank 3", named

    after = alerting.Alerting(supervisor)  # the restarted launcher's
    for step in (13, 14):
        store.record_reports([("j", 1, steps(step, 1))])
    after(store.job_row("j"), time.time() + 1)
    assert straggler_events() == [named]
    assert [f["key"] for f in after.jobs["j"].stragglers] == ["rank 3"]
