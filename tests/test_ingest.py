"""Ingest at scale (issue 14): node batches, group commits, retention. A real launcher on
loopback with real SQLite, real torchrun jobs where ranks matter; retention's bucket rules
also straight on a real SQLite store, where every bucket can be checked exactly."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
import urllib.error
import urllib.request

from conftest import wait_for

from jupyter_dlc import formatting
from jupyter_dlc.hostprocs import alive, child, job_processes
from jupyter_dlc.launcher.retention import Retention, RetentionPolicy
from jupyter_dlc.launcher.store import Store

SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"


def post_report(launcher, job_id: str, body, token: str | None = None,
                client=None) -> tuple[int, dict]:
    client = client or launcher.client
    req = urllib.request.Request(
        f"{client.url}/api/jobs/{job_id}/report", data=json.dumps(body).encode(),
        method="POST", headers={"Authorization": f"token {token or client.token}",
                                "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def all_points(client, job_id: str) -> list[dict]:
    points, since = [], 0
    while True:
        answer = client.metrics(job_id, since)
        if not answer["points"]:
            return points
        points += answer["points"]
        since = answer["last_seq"]


def ended_job(launcher, nproc: int = 2) -> dict:
    script = launcher.script("quick.py", "print('hello')\n")
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": nproc})
    return launcher.client.wait(job["id"], timeout=120)


def ended_world(launcher, monkeypatch, nodes: int, nproc: int) -> dict:
    """An ended job of nodes x nproc ranks that started no process (its workdir does not
    exist, so its preflight fails), for reports of more ranks than this machine runs: the
    launcher refuses a rank outside the job's world. The launcher is restarted with the
    process slots such a submit needs."""
    monkeypatch.setenv("DLC_PROCESS_SLOTS", str(nodes * nproc))
    launcher.restart()
    script = launcher.script("quick.py", "print('hello')\n")
    job = launcher.client.submit({"script": script, "nodes": nodes, "nproc_per_node": nproc,
                                  "workdir": os.path.join(launcher.root, "no-such-dir")})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "FAILED" and "workdir" in job["reason"], job["reason"]
    return job


# -- retention ---------------------------------------------------------------------------

def test_retention_keeps_min_max_last_and_nan_of_every_bucket(tmp_path):
    store = Store(str(tmp_path / "db.sqlite"))
    store.insert_job("j", "j", {}, "token", str(tmp_path))
    t0 = 1_700_000_000.0
    # 40 one-second buckets of 10 points; a spike in bucket 7, a NaN in bucket 12, and two
    # series (loss on rank 0 and rank 1) that must not mix.
    values = {}
    entries = {0: [], 1: []}
    for rank in (0, 1):
        for i in range(400):
            value = math.sin(i * 0.7) + rank
            if i == 75:
                value = 1e6
            if i == 123:
                value = float("nan")
            values[(rank, i)] = value
            entries[rank].append({"t": t0 + i / 10, "step": i, "values": {"loss": value}})
    store.record_reports([("j", 1, [{"rank": r, "metrics": entries[r]} for r in (0, 1)])])
    retention = Retention(store, RetentionPolicy(keep_last=25, recent_steps=50, max_points=10**6))
    retention.run_pass()

    kept = {(p["rank"], p["step"]) for p in store.metrics("j")}
    for rank in (0, 1):
        # The last 25 points, and steps within 50 of the last (399), stay as logged.
        assert all((rank, i) in kept for i in range(349, 400))
        for bucket in range(34):  # steps 0-339: entirely old
            steps = range(bucket * 10, bucket * 10 + 10)
            finite = [i for i in steps if not math.isnan(values[(rank, i)])]
            here = {i for i in steps if (rank, i) in kept}
            assert min(finite, key=lambda i: values[(rank, i)]) in here
            assert max(finite, key=lambda i: values[(rank, i)]) in here
            assert steps[-1] in here  # the bucket's last value
            nans = [i for i in steps if math.isnan(values[(rank, i)])]
            if nans:
                assert nans[0] in here
            assert len(here) <= 3 + len(nans[:1]), (bucket, sorted(here))
        assert (rank, 75) in kept and (rank, 123) in kept
    spike = [p for p in store.metrics("j") if p["step"] == 75 and p["rank"] == 0]
    assert spike[0]["value"] == 1e6
    state = store.retention_state("j")
    assert state["dropped"] > 400 and state["downsampled_until"] < t0 + 35

    # Buckets are fixed intervals of time: a second analysis removes nothing more.
    before = len(kept)
    Retention(store, retention.policy).run_pass()
    assert len(store.metrics("j")) == before


def test_a_job_over_its_cap_is_downsampled_and_the_answer_says_so(launcher, monkeypatch):
    """The analysis runs in a process of its own beside the ingest worker
    (retention_process.py); killed with -9 it is started again, and the removals it chooses
    still reach the worker's writer."""
    monkeypatch.setenv("DLC_METRICS_CAP", "400")
    monkeypatch.setenv("DLC_METRICS_KEEP_LAST", "50")
    launcher.restart()  # the launcher reads the policy at start
    job = ended_job(launcher, nproc=2)
    worker = ingest_worker(launcher)["pid"]
    first = wait_for(lambda: retention_analysis(worker), 30, what="the retention analysis process")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: retention_analysis(worker) not in (None, first), 30,
             what="a new retention analysis process")
    assert launcher.client.metrics(job["id"])["downsampled"] is None
    t0 = time.time() - 3600
    ranks = [{"rank": r, "metrics": [{"t": t0 + step, "step": step, "values": {"loss": 1.0 / (step + 1)}}
                                     for step in range(1000)]} for r in (0, 1)]
    status, answer = post_report(launcher, job["id"], {"node": 0, "attempt": job["attempt"],
                                                       "ranks": ranks})
    assert status == 200, answer
    wait_for(lambda: len(all_points(launcher.client, job["id"])) <= 400, 60,
             what="the job's points brought under its cap of 400")
    answer = launcher.client.metrics(job["id"])
    assert answer["downsampled"]["dropped"] >= 1600 and answer["downsampled"]["bucket_seconds"] > 1
    # What the notebook view shows under its charts, from this very answer.
    note = formatting.downsampled_note(answer["downsampled"])
    assert note.startswith("Points logged before ") and "are downsampled (min, max and last" in note
    assert formatting.downsampled_note(None) == ""
    points = all_points(launcher.client, job["id"])
    for rank in (0, 1):
        steps = [p["step"] for p in points if p["rank"] == rank]
        assert 999 in steps and 0 in steps  # the last point and the first bucket's maximum


# -- node batches ------------------------------------------------------------------------

def test_a_batch_larger_than_the_socket_takes_at_once_reaches_the_ingest_worker_whole(launcher, monkeypatch):
    """A node batch of about 7.5 MB (under the 8 MB cap), far more than a socket buffer,
    goes to the ingest worker in pieces: every point is stored, and the launcher answers on."""
    job = ended_world(launcher, monkeypatch, 2, 48)
    ranks = [{"rank": r, "metrics": [{"t": 1.0 + step, "step": step, "values": {"loss": step / 7.0}}
                                     for step in range(1200)]} for r in range(96)]
    body = {"node": 0, "attempt": job["attempt"], "ranks": ranks}
    assert 6 << 20 < len(json.dumps(body)) < 8 << 20
    status, answer = post_report(launcher, job["id"], body)
    assert status == 200, answer
    assert launcher.client.request("GET", "/healthz")[1]["ok"]
    points = all_points(launcher.client, job["id"])
    assert len(points) == 96 * 1200
    assert {(p["rank"], p["step"]) for p in points} == {(r, s) for r in range(96) for s in range(1200)}


def test_a_bad_batch_entry_is_a_one_line_400_naming_it_and_nothing_is_stored(launcher):
    job = ended_job(launcher)
    events = launcher.client.events(job["id"])
    good = {"rank": 0, "metrics": [{"t": time.time(), "step": 1, "values": {"loss": 0.5}}],
            "events": [{"type": "note", "step": 1}]}
    bad = {"rank": 1, "metrics": [{"t": time.time(), "step": 1, "values": {"loss": "high"}}]}
    status, answer = post_report(launcher, job["id"], {"node": 0, "ranks": [good, bad]})
    assert status == 400
    assert answer["error"].startswith("ranks[1].metrics[0].values.loss: ") and "\n" not in answer["error"]
    status, answer = post_report(launcher, job["id"], {"node": 0, "ranks": [good, {"rank": "1"}]})
    assert status == 400 and answer["error"].startswith("ranks[1].rank: ")
    status, answer = post_report(launcher, job["id"], {"node": 0, "ranks": [good], "metrics": []})
    assert status == 200, answer  # an empty list of its own is no data
    status, answer = post_report(launcher, job["id"], {"node": 0, "ranks": [good],
                                                       "metrics": good["metrics"]})
    assert status == 400 and answer["error"].startswith("metrics: ")
    points = all_points(launcher.client, job["id"])
    assert [(p["rank"], p["step"]) for p in points] == [(0, 1)]  # only the accepted batch
    assert len(launcher.client.events(job["id"])) == len(events) + 1
    status, _ = post_report(launcher, job["id"], {"node": 0, "ranks": [good]}, token="nope")
    assert status == 401


def test_a_batch_sent_again_after_a_lost_answer_is_stored_once(launcher):
    """A rank whose answer was lost (a timeout after the launcher committed) sends the batch
    again whole, under its number `n`: stored once, directly or in a node's batch; a batch of
    another process of the rank, or a newer number, is new. Reports without `n` (an older
    runtime) are stored as they come."""
    script = launcher.script("sleeper.py", SLEEPER)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2})
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", 120, what="RUNNING")
    try:
        def metric(step):
            return [{"t": time.time(), "step": step, "values": {"dup": float(step)}}]

        sends = [({"rank": 0, "attempt": 1, "pid": 11, "n": 1, "metrics": metric(1)}),
                 ({"rank": 0, "attempt": 1, "pid": 11, "n": 1, "metrics": metric(1)}),  # again
                 ({"node": 0, "attempt": 1, "ranks": [  # again, through the node reporter
                     {"rank": 0, "pid": 11, "n": 1, "metrics": metric(1)},
                     {"rank": 1, "pid": 12, "n": 1, "metrics": metric(1)}]}),
                 ({"rank": 0, "attempt": 1, "pid": 11, "n": 2, "metrics": metric(2)}),
                 ({"rank": 0, "attempt": 1, "pid": 99, "n": 1, "metrics": metric(3)}),  # a new process
                 ({"rank": 1, "attempt": 1, "metrics": metric(4)}),
                 ({"rank": 1, "attempt": 1, "metrics": metric(4)})]
        assert [post_report(launcher, job["id"], body)[0] for body in sends] == [200] * len(sends)
        stored = sorted((p["rank"], p["step"]) for p in all_points(launcher.client, job["id"])
                        if p["name"] == "dup")
        assert stored == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 4), (1, 4)], stored
    finally:
        launcher.client.stop(job["id"])


def test_node_batches_keep_per_rank_heartbeat_verdicts(launcher):
    """A batch is a heartbeat of each rank in it, not of the node: a rank that stops
    reporting is judged silent while its node's batches still arrive."""
    script = launcher.script("sleeper.py", SLEEPER)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                  "heartbeat_interval": "1s", "heartbeat_misses": 3,
                                  "max_restarts": 0})
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", 120, what="RUNNING")
    stop = threading.Event()
    sent = []

    def node_reporter():
        step = 0
        while not stop.is_set():
            ranks = [{"rank": 0, "metrics": [{"t": time.time(), "step": step, "values": {"loss": 1.0}}]}]
            if step < 3:
                ranks.append({"rank": 1})  # rank 1 reports at first, then goes silent
            sent.append(post_report(launcher, job["id"], {"node": 0, "attempt": 1, "ranks": ranks})[0])
            step += 1
            stop.wait(0.3)

    thread = threading.Thread(target=node_reporter, daemon=True)
    thread.start()
    try:
        ended = launcher.client.wait(job["id"], timeout=120)
    finally:
        stop.set()
        thread.join()
    assert ended["state"] == "FAILED"
    assert ended["reason"].startswith("rank 1 missed 3 heartbeats"), ended["reason"]
    assert set(sent) == {200} and len(sent) > 10  # rank 0's batches went on all along
    rank0 = {r["rank"]: r for r in ended["ranks"]}[0]
    assert rank0["last_step"] >= 10


def test_ranks_report_through_their_node_reporter(launcher):
    """A 1x2 job: the local engine starts the node reporter beside torchrun, both ranks'
    metrics arrive complete through it, and it leaves with the job."""
    script = launcher.script("logger.py", """
        import os
        from jupyter_dlc import runtime
        from jupyter_dlc.runtime.report import get_reporter
        runtime.init()
        for step in range(50):
            runtime.log(step, loss=1.0 / (step + 1))
        assert get_reporter().flush(30)
        print("VIA", get_reporter().reports_via_node, flush=True)
        """)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2})
    job = launcher.client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    points = all_points(launcher.client, job["id"])
    for rank in (0, 1):
        steps = sorted(p["step"] for p in points if p["rank"] == rank and p["name"] == "loss")
        assert steps == list(range(50))
    via = [line["text"] for line in launcher.client.logs(job["id"])["lines"]
           if line["text"].startswith("VIA ")]
    assert len(via) == 2 and all(int(text.split()[1]) > 0 for text in via), via
    attempt_dir = os.path.join(job["job_dir"], "attempt-1")
    wait_for(lambda: not os.path.exists(os.path.join(attempt_dir, "node-0.reporter")), 30,
             what="the node reporter gone with its node")
    wait_for(lambda: launcher.own_processes() == [], 30, what="no process of the job left")


def test_past_its_request_budget_the_launcher_paces_each_node_reporter(launcher, monkeypatch):
    """The launcher's request budget set to 4 a second: with 12 nodes reporting, every answer
    asks for the slowest pace; a real node reporter then forwards at most once per pace, and
    every rank report it carried is stored; once only one node reports, the pace is 0 again
    (a small job keeps its own quarter second)."""
    from jupyter_dlc.node.reporter import MAX_PACE, NodeReporter

    monkeypatch.setenv("DLC_REPORT_BUDGET", "4")
    launcher.restart()  # the launcher reads its budget at start
    script = launcher.script("sleeper.py", SLEEPER)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2})
    wait_for(lambda: launcher.client.job(job["id"])["state"] == "RUNNING", 120, what="RUNNING")

    def pace_from(nodes) -> float:
        paces = [post_report(launcher, job["id"], {"node": n, "attempt": 1, "ranks": [{"rank": 0}]})[1]
                 ["report_interval"] for n in nodes]
        return paces[-1]

    assert pace_from([0]) == 0
    wait_for(lambda: pace_from(range(12)) == MAX_PACE, 30, what="12 senders paced")
    others = threading.Event()

    def keep_others_reporting():
        while not others.wait(0.5):
            pace_from(range(1, 12))

    threading.Thread(target=keep_others_reporting, daemon=True).start()
    forwards: list[float] = []

    class Recording(NodeReporter):
        def _forward(self, waiters):
            forwards.append(time.monotonic())
            super()._forward(waiters)

    node = Recording(launcher.client.url, job["id"], launcher.client.token, node=0, attempt=1)
    answers = []

    def rank(number: int):
        for step in range(12):
            waiter = node.submit({"rank": number, "metrics": [
                {"t": time.time(), "step": step, "values": {"loss": float(step)}}]})
            waiter.done.wait(30)
            answers.append(waiter.status)

    ranks = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    try:
        for thread in ranks:
            thread.start()
        for thread in ranks:
            thread.join(120)
    finally:
        others.set()
    assert answers == [200] * 24 and node.pace == MAX_PACE
    # The first forward learnt the pace; every later one kept it.
    gaps = [b - a for a, b in zip(forwards[1:-1], forwards[2:], strict=True)]
    assert gaps and min(gaps) >= MAX_PACE - 0.01, gaps
    points = all_points(launcher.client, job["id"])
    assert sorted(p["step"] for p in points if p["name"] == "loss") == sorted(list(range(12)) * 2)
    wait_for(lambda: pace_from([0]) == 0, 30, interval=0.5, what="the pace back to 0")
    launcher.client.stop(job["id"])


# A 2x2 job for the engines with nodes of their own (Slurm, SSH; tests/test_slurm.py and
# test_ssh.py run it through `check_node_reporters`): 20 steps, then a wait for the test's
# go file (meanwhile it kills node 1's reporter), then 20 more. Each rank prints how many of
# its reports went through its node reporter and how many directly, before and after.
THROUGH_NODE_REPORTERS = """
import os, time
from jupyter_dlc import runtime
from jupyter_dlc.runtime.report import get_reporter
runtime.init()
reporter = get_reporter()

def sent(when):
    assert reporter.flush(60)
    via = reporter.reports_via_node
    print("SENT", when, via, reporter.reports_sent - via, flush=True)

def steps(first):
    for step in range(first, first + 20):
        runtime.log(step, loss=1.0 / (step + 1))
        time.sleep(0.05)

steps(0)
sent("before")
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.1)
steps(20)
sent("after")
"""


def node_reporter_pids(job_id: str) -> dict[int, int]:
    """node rank -> pid of that node's reporter process, for a running job."""
    found = {}
    for (job, _), pids in job_processes().items():
        for pid in pids if job == job_id else []:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            except OSError:
                continue
            if b"jupyter_dlc.node.reporter" in argv:
                found[int(environ[b"DLC_NODE_RANK"])] = pid
    return found


def sent_lines(client, job_id: str, when: str) -> dict[int, tuple[int, int]]:
    """rank -> (reports through the node reporter, reports sent directly), as it printed."""
    return {line["rank"]: (int(line["text"].split()[2]), int(line["text"].split()[3]))
            for line in client.logs(job_id)["lines"] if line["text"].startswith(f"SENT {when} ")}


def check_node_reporters(client, spec: dict, go, timeout: float = 240) -> dict:
    """Run THROUGH_NODE_REPORTERS as `spec` says (2x2 on an engine): every rank's reports go
    through its node's reporter; node 1's reporter is killed mid-job, and its ranks go on
    reporting directly; every step of every rank is stored. Returns the ended job."""
    job = client.submit(dict(spec, nodes=2, nproc_per_node=2, env={"GO": str(go)}))
    wait_for(lambda: len(sent_lines(client, job["id"], "before")) == 4, timeout,
             what="all 4 ranks through their first 20 steps")
    before = sent_lines(client, job["id"], "before")
    assert all(via > 0 for via, _ in before.values()), before  # node batches on every node
    reporters = node_reporter_pids(job["id"])
    assert sorted(reporters) == [0, 1], reporters
    os.kill(reporters[1], signal.SIGKILL)
    wait_for(lambda: 1 not in node_reporter_pids(job["id"]), 30, what="node 1's reporter gone")
    go.write_text("go")
    ended = client.wait(job["id"], timeout=timeout)
    assert ended["state"] == "SUCCEEDED", ended["reason"]
    after = sent_lines(client, job["id"], "after")
    for rank in (0, 1):  # node 0: still through its reporter, never directly
        assert after[rank][0] > before[rank][0] and after[rank][1] == before[rank][1], (before, after)
    for rank in (2, 3):  # node 1: directly once its reporter was gone
        assert after[rank][1] > before[rank][1], (before, after)
    assert_every_step(client, job["id"], 4, 40)
    return ended


def assert_every_step(client, job_id: str, world: int, steps: int) -> None:
    points = all_points(client, job_id)
    for rank in range(world):
        stored = sorted(p["step"] for p in points if p["rank"] == rank and p["name"] == "loss")
        assert stored == list(range(steps)), (rank, stored)


# -- restart under load ------------------------------------------------------------------

def load_across(launcher, job, disrupt, retry_status: int | None = None) -> None:
    """4 nodes of 8 ranks report steps in a loop to `job` (of 32 ranks at least); `disrupt()`
    runs mid-load; every batch the launcher acknowledged (200) must be stored. `retry_status`:
    an answer that means "not stored, retry" during the disruption (any other non-200 fails
    the test)."""
    acknowledged: set[tuple[int, int]] = set()
    lock = threading.Lock()
    stop = threading.Event()
    restarting = threading.Event()
    errors = []

    def node(node_id: int) -> None:
        step = 0
        while not stop.is_set():
            ranks = [{"rank": node_id * 8 + r, "metrics": [
                {"t": time.time(), "step": step, "values": {"loss": float(step)}}]} for r in range(8)]
            client = launcher.client
            try:
                status, _ = post_report(launcher, job["id"], {"node": node_id, "ranks": ranks},
                                        client=client)
            except OSError:
                status = None  # the launcher is down: this batch is not acknowledged
            if status == 401 and (restarting.is_set() or client is not launcher.client):
                status = None  # the old launcher's token, sent to the new one
            if status == retry_status:
                status = None
            if status == 200:
                with lock:
                    acknowledged.update((r["rank"], step) for r in ranks)
            elif status is not None:
                errors.append(status)
            step += 1

    threads = [threading.Thread(target=node, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acknowledged) >= 32 * 20, 60, what="load before the disruption")
        restarting.set()
        disrupt()
        restarting.clear()
        count = len(acknowledged)
        wait_for(lambda: len(acknowledged) >= count + 32 * 20, 60, what="load after it")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    stored = {(p["rank"], p["step"]) for p in all_points(launcher.client, job["id"])}
    assert acknowledged <= stored, sorted(acknowledged - stored)[:10]


def test_a_launcher_restart_under_load_loses_no_acknowledged_point(launcher, monkeypatch):
    job = ended_world(launcher, monkeypatch, 4, 8)
    load_across(launcher, job, lambda: launcher.restart(kill=True))  # kill -9, a new one on the data


def ingest_worker(launcher) -> dict:
    return launcher.client.request("GET", "/healthz")[1]["ingest"]


def retention_analysis(worker: int) -> int | None:
    """The pid of the ingest worker's retention analysis process, if it has one now."""
    return child(worker, b"retention_process")


def test_an_ingest_worker_killed_under_load_is_replaced_and_loses_no_acknowledged_point(launcher, monkeypatch):
    """Reports are parsed and stored in a process of their own (ingest_worker.py): killed
    with -9 mid-load, the reports it held are answered 503 (a reporter retries them), a new
    one takes over, and every acknowledged point is stored."""
    job = ended_world(launcher, monkeypatch, 4, 8)  # first: it restarts the launcher
    first = ingest_worker(launcher)
    analysis = wait_for(lambda: retention_analysis(first["pid"]), 30, what="the retention analysis")

    def kill_worker():
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: ingest_worker(launcher)["starts"] == first["starts"] + 1, 30,
                 what="a new ingest worker")

    load_across(launcher, job, kill_worker, retry_status=503)
    assert ingest_worker(launcher)["pid"] != first["pid"]
    # Its retention analysis saw its end of their socket pair close, and left with it.
    wait_for(lambda: not alive(analysis), 30, what="the killed worker's retention analysis gone")


def test_a_launcher_killed_leaves_no_ingest_worker_behind(launcher):
    old = ingest_worker(launcher)["pid"]
    analysis = wait_for(lambda: retention_analysis(old), 30, what="the retention analysis")
    launcher.restart(kill=True)
    wait_for(lambda: not alive(old), 30, what="the old launcher's ingest worker gone")
    wait_for(lambda: not alive(analysis), 30, what="the old ingest worker's retention analysis gone")
    job = ended_job(launcher, nproc=1)  # the new launcher's worker takes reports
    status, answer = post_report(launcher, job["id"], {"rank": 0, "metrics": [
        {"t": time.time(), "step": 1, "values": {"loss": 0.5}}]})
    assert status == 200, answer
    assert [p["step"] for p in all_points(launcher.client, job["id"])] == [1]


def test_alert_rules_read_only_the_metrics_they_name_and_never_fall_behind(tmp_path):
    """Alerting reads the points of the metrics its rules name, however many others arrive,
    and its cursor moves past all of them (a per-read limit once left it ever further behind
    when thousands of ranks logged every step)."""
    store = Store(str(tmp_path / "db.sqlite"))
    store.insert_job("j", "j", {}, "token", str(tmp_path))
    entries = [{"t": 1000.0 + i, "step": i, "values": {"loss": float(i), "samples_per_s": 9.0}}
               for i in range(30_000)]
    store.record_reports([("j", 1, [{"rank": 0, "metrics": entries}])])
    newest, points = store.metric_points("j", 0, ["loss", "gpu_util"])
    assert newest == max(p["seq"] for p in store.metrics("j", 59_000))
    assert [name for _, name, *_ in points] == ["loss"] * 30_000
    assert [p[4] for p in points[:3]] == [0.0, 1.0, 2.0]  # value
    assert store.metric_points("j", newest, ["loss"]) == (newest, [])
    assert store.metric_points("j", 0, []) == (newest, [])


def test_a_metrics_answer_carries_infinity_as_a_string_and_nan_as_null(tmp_path):
    """Answers with points are encoded by orjson, which would write an infinite value as
    null: such a page is encoded as every answer is, with the value as a string."""
    from jupyter_dlc.launcher.app import metrics_answer

    store = Store(str(tmp_path / "launcher.sqlite"))
    store.insert_job("job-inf", "inf", {"script": "x"}, "token", str(tmp_path))
    store.record_report("job-inf", 1, {"rank": 0, "metrics": [
        {"t": 1.0, "step": 0, "values": {"loss": 0.5}}]})
    finite = json.loads(metrics_answer(store, "job-inf", 0)[0])
    assert [p["value"] for p in finite["points"]] == [0.5]
    store.record_report("job-inf", 1, {"rank": 0, "metrics": [
        {"t": 2.0, "step": 1, "values": {"loss": math.inf, "grad": math.nan}}]})
    answer = json.loads(metrics_answer(store, "job-inf", finite["last_seq"])[0])
    assert {p["name"]: p["value"] for p in answer["points"]} == {"loss": "inf", "grad": None}
    # the same in a band read (bands.py): an infinite sum, min or max is a string too
    folded = json.loads(metrics_answer(store, "job-inf", finite["last_seq"], frozenset())[0])
    assert folded["points"] == [] and [(r["name"], r["n"], r["sum"], r["hi"]) for r in folded["bands"]] == \
        [("loss", 1, "inf", "inf")]


def test_job_rows_leave_out_only_the_alert_state(tmp_path):
    """What every tick and every event stream reads of each job: all of its row but the
    alert state; a column added to `jobs` is in it unless left out here on purpose."""
    store = Store(str(tmp_path / "launcher.sqlite"))
    store.insert_job("job-a", "a", {"script": "x"}, "token", str(tmp_path))
    store.update_job("job-a", alert_state=json.dumps({"cursors": ["x"] * 1000}))
    every = set(store.job_row("job-a").keys())
    assert set(store.job_rows()[0].keys()) == every - {"alert_state"}
    assert store.job_rows(["QUEUED"])[0]["id"] == "job-a"


def test_a_report_that_ends_a_rank_wakes_the_supervisor_at_once():
    """The ingest worker's summary says when a rank's end or first error arrived (directly or
    in a node's batch), so the launcher wakes the supervisor instead of waiting for its tick."""
    from jupyter_dlc import layout
    from jupyter_dlc.launcher.ingest_worker import report_summary

    beat = {"rank": 1, "events": [{"type": "heartbeat"}]}
    failed = {"rank": 2, "events": [{"type": layout.RANK_ERROR, "message": "boom"}]}
    assert report_summary(beat, False)["ended"] is False
    assert report_summary(failed, False)["ended"] is True
    assert report_summary({"node": 0, "ranks": [beat, failed]}, False)["ended"] is True
    assert report_summary({"node": 0, "ranks": [beat]}, False)["ended"] is False
