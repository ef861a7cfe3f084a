"""The supervisor against a scripted engine: what it does with each answer of `describe`.

A test double on purpose: these tests pin the supervisor's side of the engine contract
(PENDING with the engine's reason, an engine-ended attempt, stop and kill through the
engine, restarts as new submissions, standby agents only where declared) in milliseconds,
without a cluster. The real engines are tested with real processes (test_jobs.py,
test_recovery.py) and on a real Slurm cluster (test_slurm.py). The store is real SQLite.
"""

from __future__ import annotations

import json
import os
import time

import pytest

import importlib.metadata

from jupyter_dlc import engine_registry
from jupyter_dlc.engines import contract
from jupyter_dlc.engines.contract import (
    AttemptStatus,
    Capabilities,
    DryRun,
    Engine,
    NodeStatus,
    RankStatus,
    SubmitError,
)
from jupyter_dlc.launcher import attempt_start as attempt_start_module
from jupyter_dlc.launcher.store import Store
from jupyter_dlc.launcher.supervisor import Supervisor, create_job_dir
from jupyter_dlc.spec import JobSpec

ENGINE = "scripted"  # registered for these tests only (the `world` fixture)


class ScriptedEngine(Engine):
    """Answers `describe` from a list set by the test; records every call."""

    name = "scripted"

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.answer = AttemptStatus(phase="PENDING", reason="Priority", alive=True)
        self.store = None
        self.states_at_kill: list[str | None] = []
        # What the next submits do instead of succeeding: SubmitErrors to raise, or "crash"
        # (the job is submitted, then the launcher dies before it hears back).
        self.refusals: list = []
        self.jobs: dict[str, str] = {}  # engine job name -> its id: what adopt searches
        self.intents: list = []  # the attempt's stored intent as each submit began

    def capabilities(self, spec):
        return Capabilities(standby_agents=False, shared_filesystem=True)

    def dry_run(self, ctx):
        return DryRun(self.name, native={"attempt": ctx.attempt})

    def submit(self, ctx, request):
        assert request.native == {"attempt": ctx.attempt}  # the dry run made for this attempt
        self.calls.append(("submit", ctx.attempt))
        if self.store is not None:
            self.intents.append(self.store.attempt_row(ctx.job_id, ctx.attempt)["intent"])
        refusal = self.refusals.pop(0) if self.refusals else None
        if isinstance(refusal, SubmitError):
            raise refusal
        self.jobs[ctx.engine_name] = f"e{ctx.attempt}"
        if refusal == "crash":
            raise LauncherKilled()
        return {"engine_id": f"e{ctx.attempt}"}

    def adopt(self, ctx):
        self.calls.append(("adopt", ctx.attempt))
        found = self.jobs.get(ctx.engine_name)
        return {"engine_id": found} if found else None

    def describe(self, ctx, handle):
        return self.answer

    def stop(self, ctx, handle, grace):
        self.calls.append(("stop", ctx.attempt))

    def kill(self, ctx, handle):
        self.calls.append(("kill", ctx.attempt))

    def cleanup(self, ctx, handle):
        self.calls.append(("cleanup", ctx.attempt))

    def start_standby(self, ctx):
        self.calls.append(("standby", ctx.attempt))

    leftovers: set[str] = set()

    def leftover_jobs(self):
        return set(self.leftovers)

    def kill_leftovers(self, job_id):
        self.calls.append(("kill_leftovers", job_id))
        if self.store is not None:  # the job's state as its leftovers are killed
            row = self.store.job_row(job_id)
            self.states_at_kill.append(row["state"] if row else None)


class LauncherKilled(BaseException):
    """kill -9 of the launcher right after the engine took the job: nothing after runs."""


def running(codes=(None, None), alive=True, phase="RUNNING", reason=None):
    return AttemptStatus(
        nodes=[NodeStatus(0, alive and phase == "RUNNING")],
        ranks={r: RankStatus(r, pid=100 + r, running=code is None and alive, exit_code=code,
                             end=1.0 if code is not None else None)
               for r, code in enumerate(codes)},
        phase=phase, reason=reason, alive=alive)


@pytest.fixture
def world(tmp_path, monkeypatch):
    engine = ScriptedEngine()
    # Registered as a plugin engine would be (an entry point of the group), for this test.
    point = importlib.metadata.EntryPoint(ENGINE, f"{__name__}:ScriptedEngine", engine_registry.GROUP)
    entries = dict(engine_registry._entries(), **{ENGINE: point})
    monkeypatch.setattr(engine_registry, "_entries", lambda: entries)
    engine_registry.engine_class.cache_clear()
    monkeypatch.setitem(contract._engines, ENGINE, engine)
    store = Store(str(tmp_path / "store.sqlite"))
    engine.store = store
    supervisor = Supervisor(store, str(tmp_path), "http://127.0.0.1:1")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def submit(**fields):
        spec = JobSpec.from_dict(dict({"script": str(script), "nproc_per_node": 2,
                                       "engine": ENGINE, "restart_backoff": 0.01}, **fields))
        job_dir = create_job_dir(str(tmp_path), "job-1", spec)
        store.insert_job("job-1", spec.name, spec.to_dict(), "token", job_dir)
        return "job-1"

    class World:
        pass

    w = World()
    w.engine, w.store, w.supervisor, w.submit = engine, store, supervisor, submit
    w.job = lambda: store.job_row("job-1")
    yield w
    engine_registry.engine_class.cache_clear()  # "scripted" leaves the registry with the test


def test_pending_shows_the_engines_reason_then_runs_and_succeeds(world):
    world.submit()
    world.supervisor.tick()  # preflight, submit
    assert world.engine.calls == [("submit", 1)] and world.job()["state"] == "STARTING"
    assert "as scripted job e1" in world.job()["reason"]
    world.supervisor.tick()
    assert (world.job()["state"], world.job()["reason"]) == ("PENDING", "waiting in scripted: Priority")
    world.engine.answer = running()
    world.supervisor.tick()
    assert world.job()["state"] == "RUNNING"
    world.engine.answer = running(codes=(0, 0), alive=False, phase="ENDED")
    world.supervisor.tick()
    assert world.job()["state"] == "SUCCEEDED"
    assert ("cleanup", 1) in world.engine.calls


def test_allocated_but_not_all_ranks_up_leaves_pending_for_starting(world):
    world.submit()
    world.supervisor.tick()
    world.supervisor.tick()
    assert world.job()["state"] == "PENDING"
    world.engine.answer = AttemptStatus(ranks={0: RankStatus(0), 1: RankStatus(1)}, alive=True)
    world.supervisor.tick()
    assert world.job()["state"] == "STARTING"


def test_an_attempt_the_engine_ended_fails_with_its_reason_and_no_retry(world):
    world.submit(max_restarts=3)
    world.supervisor.tick()
    world.engine.answer = running()
    world.supervisor.tick()
    world.engine.answer = running(codes=(143, None), phase="RUNNING",
                                  reason="Slurm job 7 was cancelled outside the launcher (scancel)")
    world.supervisor.tick()
    job = world.job()
    assert job["state"] == "FAILED" and job["attempt"] == 1
    assert job["reason"] == "Slurm job 7 was cancelled outside the launcher (scancel)"
    assert ("kill", 1) in world.engine.calls


def test_a_failed_rank_restarts_as_a_new_submission_without_standbys(world):
    world.submit(max_restarts=1)
    world.supervisor.tick()
    world.engine.answer = running()
    world.supervisor.tick()
    # Training (progress reported), where the local engine would start standby agents.
    world.store.update_rank("job-1", 1, 0, last_progress=time.time())
    world.supervisor.tick()
    assert world.engine.calls == [("submit", 1)]  # no standby: the engine does not declare them
    world.engine.answer = running(codes=(None, 1))
    world.supervisor.tick()
    assert world.job()["state"] == "RESTARTING" and ("kill", 1) in world.engine.calls
    world.engine.answer = running(codes=(None, 1), alive=False, phase="ENDED")
    world.supervisor.tick()  # the old attempt is gone: a new one is queued
    world.supervisor.tick()  # ... and submitted
    assert world.job()["attempt"] == 2 and ("submit", 2) in world.engine.calls


@pytest.mark.parametrize("phase", ["PENDING", "RUNNING"])
def test_stop_goes_through_the_engine_and_kills_after_the_grace(world, phase):
    world.submit(stop_grace=0.01)
    world.supervisor.tick()
    world.engine.answer = running() if phase == "RUNNING" else AttemptStatus(
        phase="PENDING", reason="Resources", alive=True)
    world.supervisor.tick()
    assert world.job()["state"] == phase
    world.supervisor.request_stop("job-1", grace=30.0)
    if phase == "PENDING":  # nothing of the script runs yet: no grace, the engine kills
        assert world.job()["state"] == "STOPPING" and ("kill", 1) in world.engine.calls
        assert ("stop", 1) not in world.engine.calls
    else:
        assert world.job()["state"] == "STOPPING" and world.engine.calls[-1] == ("stop", 1)
        world.supervisor.tick()  # within the grace: nothing more
        assert ("kill", 1) not in world.engine.calls
        world.store.update_job("job-1", stop_requested=time.time() - 1)  # the grace is over
    world.supervisor.tick()  # still alive after the grace: kill
    assert ("kill", 1) in world.engine.calls and world.job()["state"] == "STOPPING"
    world.engine.answer = AttemptStatus(phase="ENDED", alive=False)
    world.supervisor.tick()
    world.supervisor.tick()  # gone in two looks a tick apart is gone (supervisor.finish_stop)
    assert world.job()["state"] == "STOPPED"


def test_stop_before_submission_never_reaches_the_engine(world):
    world.submit()
    world.supervisor.request_stop("job-1", grace=1.0)
    world.supervisor.tick()
    # Nothing submitted, stopped or killed; only the sweep any ended job gets.
    assert world.job()["state"] == "STOPPED"
    assert world.engine.calls == [("kill_leftovers", "job-1")]
    assert not os.path.exists(os.path.join(world.job()["job_dir"], "attempt-1", "job.sbatch"))


def test_leftovers_of_ended_jobs_are_swept_through_the_engine_and_only_ours(world):
    """The supervisor reads no /proc and sends no signal: an ended job's leftovers (and a
    deleted job's) are the engine's to find and kill; another launcher's job is not touched."""
    world.submit()
    world.supervisor.tick()
    world.engine.answer = running(codes=(0, 0), alive=False, phase="ENDED")
    world.supervisor.tick()
    assert world.job()["state"] == "SUCCEEDED"
    assert world.engine.calls.count(("kill_leftovers", "job-1")) == 1  # as it ended
    # Before it read as ended: nobody who sees SUCCEEDED finds a process of it still running.
    assert world.engine.states_at_kill == ["RUNNING"]
    world.engine.leftovers = {"job-1", "another-launchers-job"}  # a straggler shows up later
    world.supervisor.tick()  # within a second of the last sweep: none yet
    assert world.engine.calls.count(("kill_leftovers", "job-1")) == 1
    world.supervisor.sweep_ended()  # the next sweep (SWEEP_EVERY)
    assert world.engine.calls.count(("kill_leftovers", "job-1")) == 2
    assert ("kill_leftovers", "another-launchers-job") not in world.engine.calls
    world.supervisor.forget("job-1")  # a delete
    assert world.engine.calls.count(("kill_leftovers", "job-1")) == 3


def test_a_large_job_is_judged_less_often_and_a_failure_still_ends_it(world):
    """A job of 2,048 ranks is read and judged at most every half second (a tick is 0.2 s),
    and the rank that failed meanwhile still ends the attempt at the next look."""
    world.submit(nodes=1024, max_restarts=0)
    world.supervisor.tick()  # preflight, submit
    world.engine.answer = running(codes=(None,) * 2048)
    world.supervisor.tick()
    assert world.job()["state"] == "RUNNING"
    # A second past the tick's own look, whatever the machine's load: this look is judged.
    looked = time.time() + 1.0
    world.supervisor.watch(world.job(), looked)  # judged now: all ranks up
    codes = [None] * 2048
    codes[5] = 3
    world.engine.answer = running(codes=tuple(codes))
    world.supervisor.watch(world.job(), looked + 0.3)  # too soon for 2,048 ranks
    assert world.job()["state"] == "RUNNING"
    world.supervisor.watch(world.job(), looked + 0.5)
    assert world.job()["state"] == "FAILED"
    assert world.job()["reason"].startswith("rank 5") and "exited with code 3" in world.job()["reason"]


def test_rendezvous_ports_come_from_below_the_ephemeral_range_and_are_free():
    """A port bound to 0 comes from the range every outgoing connection draws from; one of
    them took such a port before torchrun bound it (EADDRINUSE under load). Ports are now
    drawn below that range, and each is free when handed out."""
    import socket

    from jupyter_dlc.launcher.attempt_start import PORT_FLOOR, _ephemeral_low, free_port

    low = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(PORT_FLOOR <= port < low for port in ports), (ports, low)
    assert len(ports) > 1  # drawn at random, not one fixed port every launcher would race for
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


# -- a submit has an outcome, and happens once ----------------------------------------------
def test_a_permanent_refusal_ends_the_job_failed_with_the_engines_words(world):
    message = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    world.engine.refusals = [SubmitError(message, permanent=True)]
    world.submit()
    world.supervisor.tick()
    job = world.job()
    assert job["state"] == "FAILED"
    assert job["reason"] == f"scripted submit refused: {message}"
    world.supervisor.tick()
    assert world.engine.calls.count(("submit", 1)) == 1  # never asked again


def test_a_transient_refusal_is_retried_with_backoff_shown_in_the_reason(world, monkeypatch):
    monkeypatch.setattr(attempt_start_module, "SUBMIT_BACKOFF", 4.0)
    timeout = "Batch job submission failed: Socket timed out on send/recv operation"
    world.engine.refusals = [SubmitError(timeout, permanent=False)] * 2
    world.submit()
    world.supervisor.tick()
    assert world.job()["state"] == "PREFLIGHT"
    assert world.job()["reason"] == f"scripted submit refused: retry 1 of 5 in 4 s: {timeout}"
    world.supervisor.tick()  # within the backoff: not asked again, the reason stays
    assert world.engine.calls.count(("submit", 1)) == 1
    assert world.job()["reason"].startswith("scripted submit refused: retry 1 of 5")

    def backoff_over():
        arow = world.store.attempt_row("job-1", 1)
        intent = json.loads(arow["intent"])
        world.store.update_attempt("job-1", 1, intent=json.dumps(dict(intent, retry_at=0)))

    backoff_over()
    world.supervisor.tick()
    assert world.job()["reason"] == f"scripted submit refused: retry 2 of 5 in 8 s: {timeout}"
    backoff_over()
    world.supervisor.tick()
    job = world.job()
    assert job["state"] == "STARTING" and "as scripted job e1" in job["reason"]
    # Before each retry the engine was asked whether an earlier try got through after all.
    assert world.engine.calls == [("submit", 1), ("adopt", 1), ("submit", 1), ("adopt", 1), ("submit", 1)]
    retries = [e["reason"] for e in world.store.events("job-1") if "retry" in (e["reason"] or "")]
    assert len(retries) == 2  # each retry is in the job's history


def test_transient_refusals_are_bounded(world, monkeypatch):
    monkeypatch.setattr(attempt_start_module, "SUBMIT_RETRIES", 2)
    world.engine.refusals = [SubmitError("slurmctld: Connection refused", permanent=False)] * 3
    world.submit()
    for _ in range(3):
        world.supervisor.tick()
        arow = world.store.attempt_row("job-1", 1)
        world.store.update_attempt("job-1", 1, intent=json.dumps(dict(json.loads(arow["intent"]), retry_at=0)))
    job = world.job()
    assert job["state"] == "FAILED"
    assert job["reason"] == "scripted submit refused 3 times: slurmctld: Connection refused; giving up"


def test_an_unforeseen_engine_error_is_retried_not_left_in_preflight_forever(world, monkeypatch):
    monkeypatch.setattr(attempt_start_module, "SUBMIT_RETRIES", 0)
    world.engine.submit = lambda ctx, request: (_ for _ in ()).throw(OSError("E2BIG"))  # type: ignore[method-assign]
    world.submit()
    world.supervisor.tick()
    job = world.job()
    assert job["state"] == "FAILED" and "OSError: E2BIG" in job["reason"]


def test_a_launcher_killed_after_the_submit_adopts_the_job_by_its_name_and_never_submits_twice(world):
    world.engine.refusals = ["crash"]
    world.submit()
    with pytest.raises(LauncherKilled):
        world.supervisor.tick()
    # The intent was stored before the engine was asked: the name the engine job carries.
    assert json.loads(world.engine.intents[0])["name"] == "dlc-job-1-a1"
    assert world.job()["state"] == "PREFLIGHT" and world.store.attempt_row("job-1", 1)["handle"] is None
    restarted = Supervisor(world.store, world.supervisor.data_dir, "http://127.0.0.1:1")
    restarted.tick()
    job = world.job()
    assert job["state"] == "STARTING" and "adopted scripted job e1 (dlc-job-1-a1)" in job["reason"]
    assert world.engine.calls.count(("submit", 1)) == 1
    assert json.loads(world.store.attempt_row("job-1", 1)["handle"])["engine_id"] == "e1"
    assert [e["type"] for e in world.store.events("job-1")].count("adopted") == 1
    world.engine.answer = running(codes=(0, 0), alive=False, phase="ENDED")
    restarted.tick()
    assert world.job()["state"] == "SUCCEEDED"


def test_an_intent_the_engine_never_received_is_submitted_again(world):
    world.engine.refusals = ["crash"]
    world.submit()
    with pytest.raises(LauncherKilled):
        world.supervisor.tick()
    world.engine.jobs.clear()  # the engine never took it (killed before sbatch reached slurmctld)
    Supervisor(world.store, world.supervisor.data_dir, "http://127.0.0.1:1").tick()
    assert world.engine.calls[-2:] == [("adopt", 1), ("submit", 1)]
    assert world.job()["state"] == "STARTING"


def test_a_store_of_an_older_launcher_gains_the_intent_column_and_keeps_its_rows(tmp_path):
    import sqlite3

    path = str(tmp_path / "old.sqlite")
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE attempts (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL,
            started REAL, ended REAL, reason TEXT, outcome TEXT, resume_path TEXT, port INTEGER,
            handle TEXT, failure TEXT, restarts INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (job_id, attempt));
        INSERT INTO attempts (job_id, attempt, state, handle) VALUES ('j', 1, 'RUNNING', '{"engine_id": "7"}');
    """)
    old.commit()
    old.close()
    store = Store(path)
    row = store.attempt_row("j", 1)
    assert row["handle"] == '{"engine_id": "7"}' and row["state"] == "RUNNING" and row["intent"] is None
    store.update_attempt("j", 1, intent='{"name": "dlc-j-a1"}')
    assert Store(path).attempt_row("j", 1)["intent"] == '{"name": "dlc-j-a1"}'  # and opens again
def test_the_engines_checkpoint_dir_is_resolved_once_per_attempt_and_stored(world, tmp_path, monkeypatch):
    """The engine's `checkpoint_dir` (SSH: the profile's; Kubernetes: the PVC's) is asked when
    an attempt starts and kept on its row: the ranks' DLC_CHECKPOINT_DIR, the resume choice and
    the checkpoints the launcher lists all read that one, even once the engine would answer
    otherwise (a profile edited meanwhile)."""
    asked = []
    engine_dir = str(tmp_path / "engine-ckpt")

    def checkpoint_dir(spec, job_id, job_dir):
        asked.append(job_id)
        return engine_dir

    monkeypatch.setattr(world.engine, "checkpoint_dir", checkpoint_dir, raising=False)
    world.submit()
    assert world.supervisor.checkpoint_dir(world.job()) == engine_dir  # nothing started: the engine
    world.supervisor.tick()
    arow = world.store.attempt_row("job-1", 1)
    assert arow["checkpoint_dir"] == engine_dir
    engine_dir = str(tmp_path / "elsewhere")
    assert world.supervisor.context(world.job()).env["DLC_CHECKPOINT_DIR"] == arow["checkpoint_dir"]
    assert world.supervisor.checkpoint_dir(world.job()) == arow["checkpoint_dir"]


def test_a_store_from_before_the_checkpoint_dir_column_is_migrated_losing_nothing(tmp_path):
    import sqlite3

    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE attempts (
        job_id TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL,
        started REAL, ended REAL, reason TEXT, outcome TEXT, resume_path TEXT, port INTEGER,
        handle TEXT, failure TEXT, restarts INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, attempt));
        INSERT INTO attempts (job_id, attempt, state, resume_path, restarts)
        VALUES ('j', 1, 'FAILED', '/ck/step-5', 2);""")
    db.commit()
    db.close()
    store = Store(path)
    row = store.attempt_row("j", 1)
    assert (row["state"], row["resume_path"], row["restarts"], row["checkpoint_dir"]) == (
        "FAILED", "/ck/step-5", 2, None)
    Store(path)  # opening it again changes nothing
    assert dict(store.attempt_row("j", 1)) == dict(row)


def test_ranks_keep_node_copies_only_where_the_engine_declares_them(world, monkeypatch):
    """DLC_NODE_COPY follows the engine's `node_copies` (it followed `standby_agents`)."""
    world.submit()
    assert world.supervisor.context(world.job()).env["DLC_NODE_COPY"] == "0"
    monkeypatch.setattr(world.engine, "capabilities",
                        lambda spec: Capabilities(standby_agents=False, node_copies=True))
    assert world.supervisor.context(world.job()).env["DLC_NODE_COPY"] == "1"


def test_silence_while_no_launcher_listened_is_not_a_missed_heartbeat(world):
    """A launcher back after a kill -9 (or started again by the user an hour later) finds
    every rank's last heartbeat old: none could report while it was away. It judges their
    silence from when their reporters could reach it again, so healthy jobs go on; a rank
    that stays silent past that is still called hung."""
    world.submit(max_restarts=0)
    world.supervisor.tick()
    world.engine.answer = running()
    world.supervisor.tick()
    assert world.job()["state"] == "RUNNING"
    away = time.time() - 3600  # the last words before the launcher went away
    for rank in (0, 1):  # update_rank(job, attempt, rank)
        world.store.update_rank("job-1", 1, rank, last_heartbeat=away, last_progress=away)
    world.supervisor.tick()  # a launcher that just started: the ranks may not have found it
    assert world.job()["state"] == "RUNNING", world.job()["reason"]
    world.supervisor.awake_since -= 60  # a minute later, and still nothing from rank 0
    world.store.update_rank("job-1", 1, 1, last_heartbeat=time.time(), last_progress=time.time())
    world.supervisor.tick()
    assert world.job()["state"] == "FAILED"
    assert world.job()["reason"].startswith("rank 0") and "missed 3 heartbeats" in world.job()["reason"]
