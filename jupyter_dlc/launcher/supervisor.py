"""The supervisor (AIMaster's job): drives every job through its lifecycle.

    QUEUED → PREFLIGHT → STARTING → RUNNING → SUCCEEDED | FAILED | STOPPED
    RUNNING → RESTARTING → QUEUED (attempt + 1, resumed from the newest committed step)
    any active state → STOPPING → STOPPED (a user's stop: SIGTERM, grace, SIGKILL)
    QUEUED | PREFLIGHT | RESTARTING → STOPPED (a stop before anything of the attempt runs)

Every move is compare-and-set on the state it was decided from (Store.transition), so a
stop (run on the launcher's action workers, launcher/app.py) and this thread's start or
verdict never overwrite each other. QUEUED jobs start in submission order as their ranks
fit in the process slots (admission).

All state lives in the store and in the job directory, and what of a job still runs is the
engines' to find (the local engine by cgroup and environment, in engines/local/engine.py; this
module reads no /proc and sends no signal), so a launcher started after a crash (or kill -9)
picks up where the last one left off: the loop has no memory of its own beyond timers it
can recompute.

The supervisor's jobs, one module each: `admission.py` (which QUEUED jobs start),
`attempt_start.py` (context, preflight, pool or submit), `judging.py` (what the engine and the
ranks say: success, failure, hang), `ending.py` (kills, restarts, stops, resume). This module
is the loop that drives them, and what a job keeps or leaves when it ends.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import threading
import time
import traceback
from typing import Any, Iterable

from .. import identity, layout
from ..engines import children
from ..engines.contract import (
    AttemptContext,
    get_engine,
    kill_leftovers,
    leftover_jobs,
    refresh_engines,
    release_all,
)
from ..spec import JobSpec
from . import checkpoints
from .admission import Admission
from .attempt_start import AttemptStart
from .ending import Ending
from .judging import Judging
from .pools import Pools
from .store import ACTIVE_STATES, TERMINAL_STATES, Store

log = logging.getLogger("jupyter_dlc.launcher")


# Stragglers of ended jobs are looked for this often, not every tick: the look reads every
# process's environment on the machine (a job's own end already killed what it knew of).
SWEEP_EVERY = 1.0


class Supervisor(AttemptStart, Judging, Ending, threading.Thread):
    """The loop: each tick admits, then advances every active job (attempt_start.py,
    judging.py, ending.py), runs the hooks (alerts), and sweeps what ended jobs left."""

    def __init__(self, store: Store, data_dir: str, url: str, tick: float = 0.2,
                 ca_file: str | None = None):
        super().__init__(name="dlc-supervisor", daemon=True)
        self.store = store
        self.data_dir = data_dir
        self.url = url  # the launcher's advertised URL: what ranks report to
        self.ca_file = ca_file  # what ranks trust for an https launcher
        self.awake_since = time.time()  # ranks' silence before this counts from here (heard)
        # The data dir's identity: each job's ranks get their job's key (identity.py).
        self.secret = identity.launcher_secret(data_dir)
        self.tick_seconds = tick
        self.wake = threading.Event()
        # When the loop should look again sooner than a tick (look_soon): a moment a job
        # waits on that is near, e.g. SIGKILLed survivors about to be gone.
        self._soon: float | None = None
        self.stopped = threading.Event()
        # Callables (job_row, now, final=False) run each tick, and once more with final=True
        # as an attempt ends, so what its last reports said is judged too (alerts).
        self.hooks: list[Any] = []
        # Commands for ranks (from checkpoint-and-stop alerts), handed out with report answers.
        self.pending: dict[str, set[str]] = {}
        # Jobs suspected of a hang: (attempt, when their ranks were asked for their stacks).
        self.stacks_asked: dict[str, tuple[int, float]] = {}
        # One per job, held while its attempt starts (preflight, the engine's submit) and
        # while a stop of it decides: a stop never sees a start half done, so it can end a
        # job that has not started at once, and a start never spawns processes for a job
        # that was stopped meanwhile. Per job, so that one slow submit (an sbatch of up to
        # 30 s) holds up the stops of that job only.
        self._lifecycles: dict[str, threading.RLock] = {}
        self._lifecycles_guard = threading.Lock()
        self._seen_gone: set[str] = set()
        self._gone_since: dict[tuple[str, int], float] = {}  # (job, attempt): first seen with nothing
        # Jobs whose leftovers went as they ended, this tick (the tick's own sweep skips them).
        self._swept: set[str] = set()
        self._watched: dict[str, tuple[float, int]] = {}  # job -> (last watched, its ranks)
        self._last_sweep = 0.0
        # Jobs whose end for a full disk could not even be stored (logged once each).
        self._unwritable: set[str] = set()
        # Admission: which QUEUED jobs may start (launcher/admission.py).
        self.admission = Admission(store)
        # Warm pools (launcher/pools.py): an attempt starts on its shape's pool when one is free.
        self.pools = Pools(store, data_dir)

    def lifecycle(self, job_id: str) -> threading.RLock:
        """The lock a job's start and a stop of it share."""
        with self._lifecycles_guard:
            return self._lifecycles.setdefault(job_id, threading.RLock())

    def commands_for(self, job_id: str, rank: int) -> list[str]:
        del rank  # every rank gets the same command; they act on it at the same step boundary
        return sorted(self.pending.get(job_id, ()))

    # -- the loop -----------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop after its tick and join it (a tick in an engine call may take up
        to that call's own timeout; past `timeout` the launcher exits and the next one
        adopts), then close the hooks that hold threads (alerting's webhooks) and the pools."""
        self.stopped.set()
        self.wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        for hook in self.hooks:
            close = getattr(hook, "close", None)
            if close is not None:
                close()
        self.pools.shutdown()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not end supervision of every job
                log.error("supervisor tick failed:\n%s", traceback.format_exc())
            soon, self._soon = self._soon, None
            self.wake.wait(self.tick_seconds if soon is None
                           else max(0.0, min(self.tick_seconds, soon - time.monotonic())))
            self.wake.clear()

    def look_soon(self, seconds: float) -> None:
        """Tick again within `seconds` rather than a whole tick later (from the loop's thread)."""
        at = time.monotonic() + seconds
        if self._soon is None or at < self._soon:
            self._soon = at

    def tick(self) -> None:
        children.reap()  # only what the engines started and left to us (engines/children.py)
        if self.store.guard is not None:
            self.store.guard.check()
        refresh_engines()
        now = time.time()
        rows = self.store.job_rows(ACTIVE_STATES)
        self._swept.clear()
        admitted = self.admission.admit(rows)
        for row in rows:
            if row["state"] == "QUEUED" and row["id"] not in admitted:
                continue
            try:
                self.advance(row, now)
                for hook in self.hooks:
                    hook(self.store.job_row(row["id"]), now)
                if self.store.job_row(row["id"])["state"] not in ACTIVE_STATES:
                    if row["id"] not in self._swept:
                        self.kill_leftovers(row["id"])
                    self.release(row["id"])
            except Exception as error:  # noqa: BLE001 - nor one job's error the others'
                if self.store.spent(error):
                    self.end_for_disk(row["id"])
                else:
                    log.error("job %s: %s", row["id"], traceback.format_exc())
        if now - self._last_sweep >= SWEEP_EVERY:
            self._last_sweep = now
            self.sweep_ended()
        self.pools.tick(now)


    def sweep_ended(self) -> None:
        """No process outlives its job: kill what still runs for a job recorded as ended
        (a stop that ended it from another thread, a straggler that escaped one tick)."""
        for job_id in leftover_jobs():
            state = self.store.state(job_id)  # None: another launcher's job, not ours to touch
            if state in TERMINAL_STATES:
                self.kill_leftovers(job_id)
        # Nor any node-held checkpoint copy (a rank may have written one as it was killed);
        # ours are named by our job directories, and one of a deleted job goes too.
        for job_id, path in layout.node_copy_jobs().items():
            if path == layout.node_copy_dir(self.job_dir(job_id)) and \
                    self.store.state(job_id) in (*TERMINAL_STATES, None):
                layout.discard_node_copy(path)

    def kill_leftovers(self, job_id: str) -> None:
        """An ended job keeps nothing: no process on any engine (stragglers of any attempt,
        standby agents, their forked ranks) and no node-held checkpoint copy."""
        kill_leftovers(job_id)
        layout.discard_node_copy(layout.node_copy_dir(self.job_dir(job_id)))

    def job_dir(self, job_id: str) -> str:
        return job_dir_path(self.data_dir, job_id)

    def release_cgroups(self) -> None:
        """At exit: engines let go of what no running job of ours holds (the local engine's
        empty cgroups; a running job's stay for the next launcher to adopt)."""
        release_all(lambda job_id: self.store.state(job_id) is not None)

    def forget(self, job_id: str) -> None:
        """A deleted job: whatever of it might still run goes with it."""
        self.kill_leftovers(job_id)
        with self._lifecycles_guard:
            self._lifecycles.pop(job_id, None)

    def release(self, job_id: str) -> None:
        """What the engine may still hold for an ended job (a Slurm allocation) is let go."""
        self._watched.pop(job_id, None)
        for key in [k for k in self._gone_since if k[0] == job_id]:
            del self._gone_since[key]
        row = self.store.job_row(job_id)
        arow = self.store.attempt_row(job_id, row["attempt"])
        if arow:
            ctx = self.context(row)
            handle = self.handle_of(ctx, arow)
            if handle:
                get_engine(ctx.spec.engine).cleanup(ctx, handle)


    def advance(self, row, now: float) -> None:
        state = row["state"]
        if state == "QUEUED":
            self.start_attempt(row)
        elif state in ("STARTING", "PENDING", "RUNNING"):
            self.watch(row, now)
        elif state == "STOPPING":
            self.finish_stop(row, now)
        elif state == "RESTARTING":
            self.maybe_restart(row, now)
        elif state == "PREFLIGHT":
            # A launcher died mid-preflight: nothing was started, so simply preflight again.
            self.start_attempt(row)

    # -- starting -----------------------------------------------------------------------
    def disk_full(self) -> bool:
        return self.store.guard is not None and self.store.guard.full


    def logs(self, row, attempt: int, ranks: Iterable[int], offsets: dict[str, int],
             tail: int | None = None, limit: int = 2 << 20) -> list[tuple[int, str]]:
        """New lines of the attempt's rank logs, through the job's engine (`Engine.logs`),
        from each rank's offset in `offsets` (updated in place), or each one's last `tail`:
        the logs route and the alert rules read here. Only the stored handle is passed: a
        reader never adopts or asks the engine to search (that is the supervisor's tick)."""
        # What a log read needs of the attempt, and no more: no engine call (a cluster profile
        # removed since the job ran must not take its logs away).
        spec = JobSpec.from_dict(json.loads(row["spec"]))
        ctx = AttemptContext(row["id"], attempt, spec, row["job_dir"],
                             layout.attempt_dir(row["job_dir"], attempt),
                             os.path.join(row["job_dir"], "script.py"), {}, 0)
        arow = self.store.attempt_row(row["id"], attempt)
        handle = json.loads(arow["handle"] or "{}") if arow else {}
        engine = get_engine(ctx.spec.engine)
        lines = []
        for rank in ranks:
            text, offsets[str(rank)] = engine.logs(ctx, handle, rank, offsets.get(str(rank), 0),
                                                   tail, limit)
            lines.extend((rank, line) for line in text)
        return lines

    def checkpoint_dir(self, row) -> str:
        """Where the job's checkpoints are: the directory its newest started attempt resolved
        (the engine's `checkpoint_dir`, stored on the attempt), else the engine's answer now
        (nothing started yet, or attempts stored before the column)."""
        for arow in reversed(self.store.attempt_rows(row["id"])):
            if arow["checkpoint_dir"]:
                return arow["checkpoint_dir"]
        spec = JobSpec.from_dict(json.loads(row["spec"]))
        return get_engine(spec.engine).checkpoint_dir(spec, row["id"], row["job_dir"])

    def checkpoint_steps(self, row) -> list[dict]:
        """The job's committed steps, each marked verified, unverified or corrupt (checkpoints.py)."""
        return checkpoints.listing(self.store, row["id"], self.checkpoint_dir(row))

    def resume_path(self, row, committed) -> str | None:
        if not committed:
            return None
        wanted = row["resume_step"]
        if wanted is None:
            return committed[-1]["path"]
        for step in committed:
            if step["step"] == wanted:
                return step["path"]
        return committed[-1]["path"]


def job_dir_path(data_dir: str, job_id: str) -> str:
    return os.path.join(data_dir, "jobs", job_id)


def create_job_dir(data_dir: str, job_id: str, spec: JobSpec) -> str:
    job_dir = job_dir_path(data_dir, job_id)
    os.makedirs(os.path.join(job_dir, "files"), exist_ok=True)
    script = os.path.join(job_dir, "script.py")
    if spec.code is not None:
        with open(script, "w") as f:
            f.write(spec.code if spec.code.endswith("\n") else spec.code + "\n")
    else:
        shutil.copyfile(spec.script, script)
    for name, path in spec.files.items():
        shutil.copyfile(path, os.path.join(job_dir, "files", name))
    with open(os.path.join(job_dir, "spec.json"), "w") as f:
        json.dump(spec.to_dict(), f, indent=1)
    return job_dir


def new_job_id(name: str) -> str:
    return f"{name[:40]}-{secrets.token_hex(3)}"
