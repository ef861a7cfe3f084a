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
"""

from __future__ import annotations

import json
import logging
from collections import Counter
import os
import secrets
import shutil
import socket
import threading
import time
import traceback
from typing import Any, Iterable

from .. import identity, layout, paths
from ..engines import children
from ..engines.contract import (
    AttemptContext,
    SubmitError,
    get_engine,
    kill_leftovers,
    leftover_jobs,
    refresh_engines,
    release_all,
)
from ..hostprocs import process_slots
from ..spec import params_env, JobSpec, network_env
from . import checkpoints
from .pools import Pools
from .preflight import run_preflight
from .storage import is_disk_full
from .store import ACTIVE_STATES, TERMINAL_STATES, Store

log = logging.getLogger("jupyter_dlc.launcher")

# After every rank reported a clean exit, an agent still alive this long is stuck in
# torchrun's exit barrier (see FIELD-NOTES): it is killed and the job still succeeds.
EXIT_BARRIER_GRACE = 5.0
# An attempt whose processes the engine no longer finds, and none of which left an exit
# record, counts as vanished once it has stayed so this long: a process caught between fork
# and exec shows no environment for an instant, and a tick right after the start (submits
# in a burst wake the supervisor again at once) would take a starting job for a dead one.
VANISHED_AFTER = 1.0
MAX_BACKOFF = 60.0
# Warm torchrun agents for the next attempt (see node/standby.py); each holds an imported
# torch (a few hundred MB) while it waits. DLC_STANDBY_AGENTS=0 turns them off.
STANDBY_AGENTS = os.environ.get("DLC_STANDBY_AGENTS", "1") != "0"


# A submit the engine refused for a reason that may pass (a timeout, a controller that does
# not answer) is tried again this many times, after SUBMIT_BACKOFF seconds, doubling each
# time (at most MAX_BACKOFF); a refusal the engine calls permanent ends the job at once.
SUBMIT_RETRIES = int(os.environ.get("DLC_SUBMIT_RETRIES", "5"))
SUBMIT_BACKOFF = float(os.environ.get("DLC_SUBMIT_BACKOFF", "2"))


# Rendezvous ports are drawn from here up to the kernel's ephemeral range.
PORT_FLOOR = 20000


def free_port() -> int:
    """A port for an attempt's rendezvous, free now, below the kernel's ephemeral range where
    there is room. A port bound to 0 and released comes from that range, which every
    outgoing connection on the machine draws from too: under load one of them took it
    before torchrun bound it, and the attempt failed with EADDRINUSE (seen in the suite)."""
    low = _ephemeral_low()
    for _ in range(64 if low - PORT_FLOOR > 1000 else 0):
        port = secrets.SystemRandom().randrange(PORT_FLOOR, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# A running job's ranks are read and judged every tick up to WATCH_EVERY_TICK ranks; a
# larger one less often, once a second at 4,096 ranks: reading and judging every rank five
# times a second was a sixth of the launcher's CPU there, for verdicts (heartbeats,
# progress) counted in seconds.
WATCH_EVERY_TICK = 1024
WATCH_RANKS_PER_SECOND = 4096
# Stragglers of ended jobs are looked for this often, not every tick: the look reads every
# process's environment on the machine (a job's own end already killed what it knew of).
SWEEP_EVERY = 1.0


class Supervisor(threading.Thread):
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
        # Admission: ranks that may run at once (fixed at start: free memory falls as jobs run).
        self.slots = process_slots()[0]
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
            self.wake.wait(self.tick_seconds)
            self.wake.clear()

    def tick(self) -> None:
        children.reap()  # only what the engines started and left to us (engines/children.py)
        if self.store.guard is not None:
            self.store.guard.check()
        refresh_engines()
        now = time.time()
        rows = self.store.job_rows(ACTIVE_STATES)
        self._swept.clear()
        admitted = self.admit(rows)
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

    def admit(self, rows) -> set[str]:
        """The QUEUED jobs that may start now: in submission order, while their ranks fit in
        the slots that jobs already past QUEUED leave free. The first that does not fit waits,
        and so does everything queued after it (no job overtakes another)."""
        used = sum(_local_slots(r) for r in rows if r["state"] != "QUEUED")
        # A sweep's trials past QUEUED, against its `parallel`: a trial that must wait for its
        # own sweep holds up no other job (it is not blocked by slots, only by its sweep).
        sweeps = Counter(sweep["id"] for r in rows if r["state"] != "QUEUED" and (sweep := _sweep_of(r)))
        admitted: set[str] = set()
        blocked = False
        for row in rows:  # ordered by submission
            if row["state"] != "QUEUED" or row["stop_requested"]:
                if row["state"] == "QUEUED":
                    admitted.add(row["id"])  # a stopped job only has to end
                continue
            sweep = _sweep_of(row)
            if sweep and sweep["parallel"] is not None and sweeps[sweep["id"]] >= sweep["parallel"]:
                reason = (f"waiting: sweep {sweep['id']} runs {sweep['parallel']} "
                          f"trial{'s' if sweep['parallel'] != 1 else ''} at a time")
                if row["reason"] != reason:
                    self.store.update_job(row["id"], reason=reason)
                continue
            need = _local_slots(row)
            if need == 0:  # its engine queues it (Slurm's own queue), not this machine
                admitted.add(row["id"])
                sweeps.update([sweep["id"]] if sweep else [])
                continue
            if not blocked and used + need <= self.slots:
                admitted.add(row["id"])
                used += need
                sweeps.update([sweep["id"]] if sweep else [])
                continue
            blocked = True
            reason = (f"waiting for {need} process slot{'s' if need != 1 else ''} "
                      f"({used} of {self.slots} in use)")
            if row["reason"] != reason:
                self.store.update_job(row["id"], reason=reason)
        return admitted

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

    def handle_of(self, ctx: AttemptContext, arow) -> dict:
        """The attempt's engine handle as stored; where none is (a launcher killed between
        submit and storing it, a store restored from a copy) the engine re-adopts the attempt
        by what it can search itself (its name, labels), and the handle is stored again."""
        handle = json.loads(arow["handle"] or "{}") if arow else {}
        if not handle and arow and arow["started"]:
            try:
                found = get_engine(ctx.spec.engine).adopt(ctx)
            except (SubmitError, RuntimeError, OSError) as error:
                # The engine cannot be asked now (slurmctld down): no handle this tick.
                log.warning("job %s: looking for %s failed: %s", ctx.job_id, ctx.engine_name, error)
                return handle
            if found:
                self.store_adopted(ctx, found, f"re-adopted {found.get('engine_id')} ({ctx.engine_name})")
                handle = found
        return handle

    def store_adopted(self, ctx: AttemptContext, handle: dict, why: str) -> None:
        """An engine job found by adoption becomes the attempt's, with an `adopted` event."""
        self.store.update_attempt(ctx.job_id, ctx.attempt, handle=json.dumps(handle))
        self.store.add_event(ctx.job_id, ctx.attempt, "adopted", why, handle)

    # -- helpers ------------------------------------------------------------------------
    def context(self, row, attempt: int | None = None, token: str = "",
                reported: bool = True) -> AttemptContext:
        """What an attempt runs with. `token` only when starting it: the store keeps a hash.
        Without `reported`, the ranks' records are left out (a reader that needs none)."""
        spec = JobSpec.from_dict(json.loads(row["spec"]))
        attempt = attempt or row["attempt"]
        arow = self.store.attempt_row(row["id"], attempt)
        job_dir = row["job_dir"]
        attempt_dir = layout.attempt_dir(job_dir, attempt)
        # Resolved by the engine once, when the attempt starts, and kept on the attempt.
        checkpoint_dir = (arow["checkpoint_dir"] if arow else None) or \
            get_engine(spec.engine).checkpoint_dir(spec, row["id"], job_dir)
        resume = arow["resume_path"] if arow else None
        env = paths.private_env(dict(os.environ))
        env.update(network_env(spec.network))
        env.update(params_env(spec.params))
        env.update(spec.env)
        env.update({
            "PYTHONUNBUFFERED": "1",
            "DLC_JOB_ID": row["id"], "DLC_JOB_NAME": row["name"], "DLC_ATTEMPT": str(attempt),
            "DLC_NNODES": str(spec.nodes), "DLC_NPROC_PER_NODE": str(spec.nproc_per_node),
            "DLC_LAUNCHER_URL": self.url, "DLC_TOKEN": token, "DLC_JOB_DIR": job_dir,
            identity.KEY_ENV: identity.job_key(self.secret, row["id"]),
            "DLC_ATTEMPT_DIR": attempt_dir, "DLC_CHECKPOINT_DIR": checkpoint_dir,
            "DLC_RESUME_PATH": resume or "", "EASYCKPT_RESUME_PATH": resume or "",
            "DLC_HEARTBEAT_INTERVAL": f"{spec.heartbeat_interval:g}",
            "DLC_KEEP_LAST": str(spec.keep_last),
            "DLC_COLLECTIVE_TIMEOUT": f"{spec.collective_timeout:g}",
            # A branch's ranks restore its parent's step running edited code (restore_state.py).
            "DLC_BRANCH_FROM": spec.branch_from or "",
            "DLC_FRESH_OPTIMIZER": "1" if spec.fresh_optimizer else "",
            # Node-held checkpoint copies only where this launcher can remove them again:
            # engines whose nodes are this machine (runtime/node_copy.py).
            "DLC_NODE_COPY": "1" if get_engine(spec.engine).capabilities(spec).node_copies else "0",
        })
        if self.ca_file:
            env["DLC_LAUNCHER_CA"] = self.ca_file
        return AttemptContext(row["id"], attempt, spec, job_dir, attempt_dir,
                              os.path.join(job_dir, "script.py"), env,
                              (arow["port"] if arow and arow["port"] else 0),
                              self.store.record_events(row["id"], attempt) if reported else [])

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

    def start_attempt(self, row) -> None:
        job_id = row["id"]
        if self.disk_full() and not row["stop_requested"]:
            # An attempt's ranks write logs and records into the job directory, and the
            # store must record their start and their end: on a full disk nothing starts.
            self.fail_for_disk(job_id, f"attempt {row['attempt']} not started; free space, "
                               "then resume the job", expect=("QUEUED", "PREFLIGHT"))
            return
        with self.lifecycle(job_id):
            row = self.store.job_row(job_id)
            if row is None or row["state"] not in ("QUEUED", "PREFLIGHT"):
                return  # a stop (or delete) won the race
            if row["stop_requested"]:
                self.store.transition(job_id, "STOPPED", "stopped before it started",
                                      expect=("QUEUED", "PREFLIGHT"))
                return
            intent = self.intent_of(row)
            if intent is not None:
                # A submit of this attempt was begun (by this launcher, or by one killed before
                # it stored the handle): the engine may hold the job already. Never submit a
                # second one before looking for it by its name.
                if time.time() < intent.get("retry_at", 0.0):
                    return  # a transient refusal: backing off (the reason says until when)
                if self.adopt_intent(row, intent):
                    return
            if self.store.transition(job_id, "PREFLIGHT", "checking the environment",
                                     expect=("QUEUED", "PREFLIGHT")):
                self._start_attempt(row)

    def intent_of(self, row) -> dict | None:
        """The attempt's recorded submit intent when it has no handle yet, else None."""
        arow = self.store.attempt_row(row["id"], row["attempt"])
        if not arow or arow["handle"] or not arow["intent"]:
            return None
        return json.loads(arow["intent"])

    def adopt_intent(self, row, intent: dict) -> bool:
        """Look for the engine job an earlier submit of the attempt started (by the name in
        its intent); adopt it, storing its handle, and move on as a started attempt."""
        ctx = self.context(row)
        engine = get_engine(ctx.spec.engine)
        try:
            found = engine.adopt(ctx)
        except (SubmitError, RuntimeError, OSError) as error:
            # The engine cannot be asked now; neither adopt nor submit again until it can.
            log.warning("job %s: looking for %s failed: %s", row["id"], intent.get("name"), error)
            intent["retry_at"] = max(intent.get("retry_at", 0.0), time.time() + SUBMIT_BACKOFF)
            self.store.update_attempt(row["id"], ctx.attempt, intent=json.dumps(intent))
            return True
        if not found:
            return False
        what = f"{engine.name} job {found.get('engine_id')} ({intent.get('name')})"
        self.store_adopted(ctx, found, f"adopted {what}, submitted before the handle was stored")
        self.store.transition(row["id"], "STARTING", f"attempt {ctx.attempt}: adopted {what}",
                              expect="PREFLIGHT")
        return True

    def _start_attempt(self, row) -> None:
        job_id = row["id"]
        ctx = self.context(row)
        port = free_port()
        self.store.update_attempt(job_id, ctx.attempt, port=port, started=time.time())
        ckpt_dir = ctx.env["DLC_CHECKPOINT_DIR"]
        steps = checkpoints.listing(self.store, job_id, ckpt_dir)
        committed = checkpoints.resumable(steps)
        last_size = steps[-1]["size"] if steps else 0
        on_nodes = get_engine(ctx.spec.engine).capabilities(ctx.spec).node_preflight
        failed = [c for c in run_preflight(ctx.spec, ctx.script_path, ckpt_dir, port, last_size,
                                           host_checks=not on_nodes) if not c.ok]
        if failed:
            self.store.transition(job_id, "FAILED", str(failed[0]),
                                  {"preflight": [c.__dict__ for c in failed]}, expect="PREFLIGHT")
            return
        resume_path = self.resume_path(row, committed)
        self.store.update_attempt(job_id, ctx.attempt, resume_path=resume_path, checkpoint_dir=ckpt_dir)
        # A fresh job token per attempt: the store keeps only its hash, so the clear one
        # exists only in the environment of this attempt's processes.
        token = secrets.token_urlsafe(18)
        self.store.set_job_token(job_id, token)
        ctx = self.context(self.store.job_row(job_id), token=token)
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        self.store.init_ranks(job_id, ctx.attempt, ctx.spec.nodes, ctx.spec.nproc_per_node)
        engine = get_engine(ctx.spec.engine)
        handle, how = self.pools.submit(ctx)
        if not handle:
            handle = self._submit(row, ctx, engine)
            if handle is None:
                return
        handle = dict(handle, start=how)
        self.store.update_attempt(job_id, ctx.attempt, handle=json.dumps(handle))
        reason = f"attempt {ctx.attempt} on {ctx.spec.nodes} node(s) x {ctx.spec.nproc_per_node}"
        reason += f"; {how}" if how else ""
        if handle.get("engine_id"):
            reason += f" as {engine.name} job {handle['engine_id']}"
        if resume_path:
            reason += f", resuming from {os.path.basename(resume_path)}"
        self.store.transition(job_id, "STARTING", reason, {"resume_path": resume_path,
                                                           "port": port}, expect="PREFLIGHT")

    def _submit(self, row, ctx: AttemptContext, engine) -> dict | None:
        """The engine's submit, with an outcome: its handle; or None, the job left FAILED (a
        permanent refusal, or transient ones past SUBMIT_RETRIES) or PREFLIGHT with the retry
        in its reason. The intent (the engine job's name) is stored before the engine is
        asked, so a launcher killed before the handle is stored finds the job by it."""
        job_id = row["id"]
        arow = self.store.attempt_row(job_id, ctx.attempt)
        intent = json.loads(arow["intent"]) if arow and arow["intent"] else {}
        tries = intent.get("tries", 0)
        intent.update(name=ctx.engine_name, engine=engine.name, t=time.time(), tries=tries + 1)
        intent.pop("retry_at", None)
        self.store.update_attempt(job_id, ctx.attempt, intent=json.dumps(intent))
        try:
            return engine.submit(ctx, engine.dry_run(ctx))
        except SubmitError as error:
            refused = error
        except Exception as error:  # noqa: BLE001 - an engine's unforeseen error: retried, bounded
            log.error("job %s: submit failed:\n%s", job_id, traceback.format_exc())
            refused = SubmitError(f"{type(error).__name__}: {error}", permanent=False)
        what = f"{_submit_verb(engine.name)} refused"
        message = " ".join(refused.message.split())  # one line, whatever the engine printed
        if refused.permanent or tries + 1 > SUBMIT_RETRIES:
            why = (f"{what}: {message}" if refused.permanent else
                   f"{what} {tries + 1} times: {message}; giving up")
            self.store.transition(job_id, "FAILED", why, {"submit": intent}, expect="PREFLIGHT")
            return None
        delay = min(MAX_BACKOFF, SUBMIT_BACKOFF * 2 ** tries)
        intent.update(retry_at=time.time() + delay, error=message)
        self.store.update_attempt(job_id, ctx.attempt, intent=json.dumps(intent))
        self.store.transition(job_id, "PREFLIGHT",
                              f"{what}: retry {tries + 1} of {SUBMIT_RETRIES} in {delay:g} s: {message}",
                              {"submit": intent}, expect="PREFLIGHT")
        return None

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

    # -- running ------------------------------------------------------------------------
    def watch(self, row, now: float) -> None:
        job_id = row["id"]
        last, world = self._watched.get(job_id, (0.0, 0))
        if row["state"] == "RUNNING" and world > WATCH_EVERY_TICK and \
                now - last < min(1.0, world / WATCH_RANKS_PER_SECOND):
            return
        ctx = self.context(row)
        arow = self.store.attempt_row(job_id, ctx.attempt)
        handle = self.handle_of(ctx, arow)
        engine = get_engine(ctx.spec.engine)
        status = engine.describe(ctx, handle)
        alive = status.alive
        ranks = self.sync_ranks(ctx, status, alive)
        self._watched[job_id] = (now, len(ranks))
        if status.phase == "PENDING":
            reason = f"waiting in {engine.name}: {status.reason}"
            if row["state"] != "PENDING" or row["reason"] != reason:
                self.store.transition(job_id, "PENDING", reason, expect=row["state"])
            return
        if status.reason:
            # The engine ended the attempt (a scancel from outside, a time limit): its word
            # is the reason, whatever the ranks said as they were taken down.
            self.end_attempt(row, ctx, handle, "cancelled", status.reason)
            return
        started = all(rs.pid for rs in status.ranks.values())
        if row["state"] in ("STARTING", "PENDING") and started:
            self.store.transition(job_id, "RUNNING", "every rank is up", expect=row["state"])
        elif row["state"] == "PENDING":
            self.store.transition(job_id, "STARTING", f"{engine.name} allocated the nodes; "
                                  "ranks starting", expect="PENDING")
        codes = [rs.exit_code for rs in status.ranks.values()]
        # The first rank to fail, by time: the others usually die of its absence.
        failed = sorted((r for r, rs in status.ranks.items() if rs.exit_code not in (None, 0)),
                        key=lambda r: (status.ranks[r].end or now, r))
        node_failed = [n for n in status.nodes if n.exit_code not in (None, 0)]
        if failed or (node_failed and not all(c == 0 for c in codes)):
            first = failed[0] if failed else None
            why = (f"rank {first}{_on_host(engine, ctx, handle, first // ctx.spec.nproc_per_node)} "
                   f"exited with code {status.ranks[first].exit_code}" if first is not None
                   else f"node {node_failed[0].node}{_on_host(engine, ctx, handle, node_failed[0].node)} "
                        f"agent exited with code {node_failed[0].exit_code}")
            self.end_attempt(row, ctx, handle, "failed", why)
            return
        if codes and all(c == 0 for c in codes):
            last_end = max((rs.end or 0) for rs in status.ranks.values())
            if alive and now - last_end < EXIT_BARRIER_GRACE:
                return
            note = self.stop_note(job_id, ctx.attempt)
            self.end_attempt(row, ctx, handle, "preempted" if note else "succeeded",
                             f"preempted: {note}; attempt ended cleanly" if note
                             else "every rank exited 0")
            return
        if not alive and not status.running:
            first = self._gone_since.setdefault((job_id, ctx.attempt), now)
            if now - first < VANISHED_AFTER:
                return
            self._gone_since.pop((job_id, ctx.attempt), None)
            lost = [r for r, rs in status.ranks.items() if rs.exit_code is None]
            self.end_attempt(row, ctx, handle, "failed",
                             f"processes of rank(s) {lost} vanished without an exit record")
            return
        self._gone_since.pop((job_id, ctx.attempt), None)
        self.check_liveness(row, ctx, handle, ranks, now)
        self.maybe_start_standby(row, ctx, ranks)

    def maybe_start_standby(self, row, ctx, ranks) -> None:
        """Once an attempt trains, warm the agents of the next one, if a restart may come."""
        engine = get_engine(ctx.spec.engine)
        if not STANDBY_AGENTS or row["state"] != "RUNNING" or \
                not engine.capabilities(ctx.spec).standby_agents:
            return
        restarts = self.store.attempt_row(row["id"], ctx.attempt)["restarts"] or 0
        if restarts >= ctx.spec.max_restarts:
            return
        if not any(r["last_progress"] for r in ranks.values()):
            return  # let the attempt's own start-up have the CPU first
        engine.start_standby(self.context(row, ctx.attempt + 1))  # once per attempt

    def stop_note(self, job_id: str, attempt: int) -> str | None:
        """What the attempt's ranks did with a stop or a preemption, as they reported it on
        leaving at a step boundary (runtime/boundary.py: the save its SIGTERM asked for, and
        whether it committed); None when no rank did."""
        left = [e["data"] or {} for e in self.store.events(job_id, types=("preempted",))
                if e["attempt"] == attempt]
        if not left:
            return None
        said = [d for d in left if "checkpoint" in d]
        if said:
            committed = [d.get("step") for d in said if d["checkpoint"]]
            tried = any(d.get("checkpointer") for d in said)
        else:  # a runtime that did not say: the commits it reported at the steps it left
            steps = {d.get("step") for d in left}
            committed = [c["step"] for c in self.store.checkpoints(job_id)
                         if c["attempt"] == attempt and c["step"] in steps]
            tried = bool(committed)
        if committed:
            return f"checkpoint committed at step {max(committed)} before exit"
        if tried:
            return "its checkpoint did not commit before exit"
        return "no checkpoint: the script has no runtime.Checkpointer"

    def sync_ranks(self, ctx, status, alive: bool) -> dict:
        """Copy what the engine knows of each rank into the store; returns the rank rows."""
        job_id = ctx.job_id
        ranks = {r["rank"]: r for r in self.store.rank_rows(job_id, ctx.attempt)}
        changed = False
        for rank, rs in status.ranks.items():
            known = ranks.get(rank)
            if known is None:
                continue
            state = ("running" if rs.running else "exited" if rs.exit_code == 0 else
                     "failed" if rs.exit_code is not None else known["state"])
            if rs.exit_code is None and rs.pid and not rs.running and not alive:
                state = "lost"
            changes = {k: v for k, v in (("pid", rs.pid), ("exit_code", rs.exit_code),
                                         ("state", state)) if v is not None and known[k] != v}
            if changes:
                changed = True
                self.store.update_rank(job_id, ctx.attempt, rank, **changes)
                if "exit_code" in changes:
                    self.store.add_event(job_id, ctx.attempt, "rank_exit",
                                         f"rank {rank} exited with code {rs.exit_code}",
                                         {"rank": rank, "exit_code": rs.exit_code})
        if not changed:  # as read: with thousands of ranks, a second read is a tick's cost
            return ranks
        return {r["rank"]: r for r in self.store.rank_rows(job_id, ctx.attempt)}

    def check_liveness(self, row, ctx, handle, ranks, now: float) -> None:
        spec = ctx.spec
        if spec.max_runtime and row["started"] and now - row["started"] > spec.max_runtime:
            self.end_attempt(row, ctx, handle, "timeout",
                             f"max runtime {spec.max_runtime:g}s exceeded")
            return
        verdict = spec.heartbeat_interval * spec.heartbeat_misses
        for rank, r in ranks.items():
            # Only ranks that use the runtime heartbeat; a plain script is judged by its exit.
            if r["last_heartbeat"] and now - self.heard(r["last_heartbeat"]) > verdict and \
                    r["exit_code"] is None:
                at = _on_host(get_engine(spec.engine), ctx, handle, rank // spec.nproc_per_node)
                self.end_attempt(row, ctx, handle, "failed",
                                 f"rank {rank}{at} missed {spec.heartbeat_misses} heartbeats "
                                 f"({now - r['last_heartbeat']:.0f}s silent): hung or stopped")
                return
        progress = [r["last_progress"] for r in ranks.values() if r["last_progress"]]
        if progress and now - self.heard(min(progress)) > spec.progress_timeout:
            reason, laggards = _hang_reason(ranks, now - min(progress))
            job_id = row["id"]
            asked = self.stacks_asked.get(job_id)
            if asked is None or asked[0] != ctx.attempt:
                # Before the kill, each rank's reporter thread is asked where its threads are
                # (runtime/stacks.py): `why` then shows where training stopped.
                self.stacks_asked[job_id] = (ctx.attempt, now)
                self.pending.setdefault(job_id, set()).add("stacks")
                self.store.add_event(job_id, ctx.attempt, "hang",
                                     f"{reason}; asking the ranks where they are")
                return
            stacks = {e["data"]["rank"]: e["data"] for e in self.store.events(job_id, types=("stacks",))
                      if e["attempt"] == ctx.attempt and e["data"]}
            live = [k for k, r in ranks.items() if r["exit_code"] is None]
            if len(stacks) < len(live) and now - asked[1] < max(3.0, 2 * spec.heartbeat_interval):
                return
            from .diagnosis import diagnose_hang

            diagnosis = diagnose_hang(ctx.attempt_dir, reason, laggards, stacks, spec.nproc_per_node)
            self.end_attempt(row, ctx, handle, "failed", reason, diagnosis=diagnosis)
            return

    def heard(self, when: float) -> float:
        """When a rank last told us something, for judging its silence. While no launcher
        listened (this one started after a kill -9 or a restart of the user's), no rank
        could: its silence counts from when its reporter could first reach this launcher
        again (the reporter's longest retry backoff after this launcher came up)."""
        return max(when, self.awake_since + layout.REPORT_MAX_BACKOFF)

    # -- ending an attempt --------------------------------------------------------------
    def end_attempt(self, row, ctx, handle, outcome: str, reason: str,
                    diagnosis: dict | None = None) -> None:
        job_id = row["id"]
        engine = get_engine(ctx.spec.engine)
        full = self.store.job_row(job_id) or row  # `row` may be a tick's, without the alert state
        for hook in self.hooks:
            hook(full, time.time(), final=True)
        if outcome == "failed":
            self.keep_scene(ctx, engine, reason)
        # Survivors of a failed attempt are blocked in a collective or about to be: no grace.
        engine.kill(ctx, handle)
        self.stacks_asked.pop(job_id, None)
        self.pending.get(job_id, set()).discard("stacks")
        if diagnosis is None and outcome in ("failed", "timeout"):
            diagnosis = self.diagnose(ctx)
        if diagnosis and reason.startswith("rank ") and diagnosis.get("exit_code") not in (None, 0):
            # A rank killed by a signal has no end time of its own; the diagnosis knows it
            # failed first, and the ranks that exited just after it died of its absence.
            at = _on_host(engine, ctx, handle, diagnosis["rank"] // ctx.spec.nproc_per_node)
            reason = f"rank {diagnosis['rank']}{at} exited with code {diagnosis['exit_code']}"
        self.store.update_attempt(job_id, ctx.attempt, outcome=outcome, ended=time.time(),
                                  reason=reason,
                                  failure=json.dumps(diagnosis) if diagnosis else None)
        if diagnosis:
            self.store.add_event(job_id, ctx.attempt, "diagnosis",
                                 f"{diagnosis.get('class')}: {diagnosis.get('suggestion', '')}",
                                 diagnosis)
        def move(state: str, why: str, data: dict | None = None) -> None:
            if state != "RESTARTING":
                # Before the job reads as ended, not a tick after: whoever sees it ended
                # finds nothing of it running (standby agents for a next attempt included).
                self.kill_leftovers(job_id)
                self._swept.add(job_id)
            # The row was read at the start of the tick: a stop may have come since. Then the
            # stop wins, and what was killed above was its end.
            if not self.store.transition(job_id, state, why, data, expect=("PENDING", "STARTING", "RUNNING")):
                self.store.transition(job_id, "STOPPED", "stopped by the user", expect="STOPPING")

        fresh = self.store.job_row(job_id)
        if fresh["stop_requested"] or fresh["state"] == "STOPPING":
            self.kill_leftovers(job_id)
            self._swept.add(job_id)
            self.store.transition(job_id, "STOPPED", "stopped by the user")
            return
        if outcome == "succeeded":
            move("SUCCEEDED", reason)
            return
        if outcome in ("timeout", "cancelled"):
            move("FAILED", reason)
            return
        if outcome == "failed" and checkpoints.corrupt_reports(self.store, job_id, ctx.attempt):
            self._restart_past_corrupt(ctx, reason, move)
            return
        arow = self.store.attempt_row(job_id, ctx.attempt)
        restarts = arow["restarts"] or 0
        if outcome == "failed":
            deterministic = self.repeats_last_failure(job_id, ctx.attempt, diagnosis)
            if deterministic:
                move("FAILED", f"{reason}; the same failure at the same step "
                     "as the previous attempt: a deterministic bug, not retrying")
                return
            if restarts >= ctx.spec.max_restarts:
                move("FAILED", f"{reason}; no restarts left (--max-restarts {ctx.spec.max_restarts})")
                return
        move("RESTARTING", f"{reason}; restarting", {"outcome": outcome})
        # The survivors were SIGKILLed above and are gone in milliseconds: look again at
        # once rather than a tick later (recovery time is what users feel).
        self.wake.set()

    def keep_scene(self, ctx, engine, reason: str) -> None:
        """The evidence folder of an attempt about to be killed (evidence.py): bounded in
        time and size, and never in the way of the kill."""
        from .evidence import keep_scene

        try:
            stacks = {e["data"]["rank"]: e["data"] for e in self.store.events(ctx.job_id, types=("stacks",))
                      if e["attempt"] == ctx.attempt and e["data"]}
            live = {r["rank"]: r["pid"] for r in self.store.rank_rows(ctx.job_id, ctx.attempt)
                    if r["exit_code"] is None and r["pid"]}
            index = keep_scene(ctx.attempt_dir, ctx.attempt, reason, ctx.spec.nodes * ctx.spec.nproc_per_node,
                               stacks, live, engine.name == "local")
            self.store.add_event(ctx.job_id, ctx.attempt, "evidence",
                                 f"kept {len(index['files'])} files of evidence in {index['seconds']:.1f}s",
                                 {"files": [f["name"] for f in index["files"]],
                                  "dir": os.path.dirname(ctx.attempt_dir + "/evidence/")})
        except Exception:  # noqa: BLE001 - evidence must never keep a failed attempt alive
            log.error("evidence of %s failed:\n%s", ctx.job_id, traceback.format_exc())

    def fail_for_disk(self, job_id: str, what: str, expect: tuple[str, ...]) -> bool:
        """End a job FAILED for the full disk, `what` saying what was not done, written even
        when the store's reserve is spent (its last one); False where even that could not."""
        assert self.store.guard is not None
        reason = self.store.guard.reason(what)
        try:
            moved = self.store.write_verdict(lambda: self.store.transition(job_id, "FAILED", reason,
                                                                           expect=expect))
        except Exception as error:  # noqa: BLE001 - nothing can be written: said once
            if job_id not in self._unwritable:
                self._unwritable.add(job_id)
                log.error("job %s: %s, and not even that could be stored: %s", job_id, reason, error)
            return False
        self._unwritable.discard(job_id)
        if moved:
            log.warning("job %s: %s", job_id, reason)
            self.kill_leftovers(job_id)
            self._swept.add(job_id)
        return moved

    def end_for_disk(self, job_id: str) -> None:
        """The store cannot write (the disk is full and the reserve spent): no rank exit,
        heartbeat or verdict of this job would be kept, so it can no longer be supervised.
        What of it runs is killed, and it ends with the condition as its reason."""
        row = self.store.job_row(job_id)
        if row is None or row["state"] in TERMINAL_STATES:
            return
        ctx = self.context(row)
        arow = self.store.attempt_row(job_id, ctx.attempt)
        try:  # the handle as stored: finding one again (handle_of) would write
            get_engine(ctx.spec.engine).kill(ctx, json.loads(arow["handle"] or "{}") if arow else {})
        except Exception:  # noqa: BLE001 - the leftovers' kill below reaches what this missed
            log.error("job %s: kill on a full disk failed:\n%s", job_id, traceback.format_exc())
        self.kill_leftovers(job_id)
        what = (f"attempt {row['attempt']} could not be watched ({row['state']}): what of it "
                "ran was killed; free space, then resume the job")
        if self.fail_for_disk(job_id, what, expect=tuple(s for s in ACTIVE_STATES if s != "STOPPING")):
            try:
                self.store.update_attempt(job_id, row["attempt"], outcome="failed", ended=time.time(),
                                          reason=self.store.guard.reason(what))
            except Exception:  # noqa: BLE001 - the job's own row says it; this is the detail
                pass
            return
        if row["state"] == "STOPPING":  # a stop asked for: it ends as the user meant
            reason = f"stopped by the user; {self.store.guard.reason('what was left was killed at once')}"
            try:
                self.store.write_verdict(lambda: self.store.transition(job_id, "STOPPED", reason,
                                                                       expect="STOPPING"))
            except Exception:  # noqa: BLE001 - nothing can be written: the next tick tries again
                pass

    def _restart_past_corrupt(self, ctx, reason: str, move) -> None:
        """A rank found its file of the resume step not matching the manifest. The attempt
        never trained, so its restart is no retry of a failure (not counted against
        --max-restarts, not a "deterministic bug"): it takes the newest step left that no rank
        found corrupt, and each such restart rules one more step out."""
        files = sorted({os.path.join(os.path.basename(os.path.dirname(r["file"] or "")),
                                     os.path.basename(r["file"] or ""))
                        for r in checkpoints.corrupt_reports(self.store, ctx.job_id, ctx.attempt)})
        left = checkpoints.resumable(checkpoints.listing(self.store, ctx.job_id,
                                                         ctx.env["DLC_CHECKPOINT_DIR"]))
        if not left:
            move("FAILED", f"{reason}; {', '.join(files)} failed verification and no other "
                 "committed checkpoint step verifies")
            return
        move("RESTARTING", f"{reason}; {', '.join(files)} failed verification: restarting from "
             f"{os.path.basename(left[-1]['path'])}", {"outcome": "failed", "checkpoint_corrupt": files})
        self.wake.set()

    def diagnose(self, ctx) -> dict | None:
        try:
            from .diagnosis import diagnose
        except ImportError:
            return None
        exits = {r["rank"]: r["exit_code"] for r in self.store.rank_rows(ctx.job_id, ctx.attempt)}
        try:
            result = diagnose(ctx.attempt_dir, exits, reported=ctx.reported)
        except Exception:  # noqa: BLE001 - a failed diagnosis must not keep a job running
            log.error("diagnosis of %s failed:\n%s", ctx.job_id, traceback.format_exc())
            return None
        if result is not None:
            # The step the failing rank had reached: what makes a repeat "the same failure".
            rows = {r["rank"]: r for r in self.store.rank_rows(ctx.job_id, ctx.attempt)}
            failing = rows.get(result.get("rank"))
            result["step"] = failing["last_step"] if failing else None
        return result

    def repeats_last_failure(self, job_id: str, attempt: int, diagnosis: dict | None) -> bool:
        if attempt < 2 or not diagnosis:
            return False
        previous = self.store.attempt_row(job_id, attempt - 1)
        if not previous or previous["outcome"] != "failed" or not previous["failure"]:
            return False
        before = json.loads(previous["failure"])
        keys = ("class", "line", "step")
        # An OOM kill depends on what else the host runs: worth another try.
        return all(before.get(k) == diagnosis.get(k) for k in keys) and \
            diagnosis.get("class") != "host_oom"

    def maybe_restart(self, row, now: float) -> None:
        job_id = row["id"]
        arow = self.store.attempt_row(job_id, row["attempt"])
        ctx = self.context(row)
        handle = self.handle_of(ctx, arow)
        engine = get_engine(ctx.spec.engine)
        if engine.describe(ctx, handle).alive:
            engine.kill(ctx, handle)
            return
        restarts = arow["restarts"] or 0
        # A preemption, or a resume step found corrupt: no failure of the job's, so no backoff
        # and no restart counted.
        preempted = arow["outcome"] == "preempted" or \
            bool(checkpoints.corrupt_reports(self.store, job_id, row["attempt"]))
        spec = JobSpec.from_dict(json.loads(row["spec"]))
        # The first restart goes at once (recovery time is what users feel); repeated ones
        # back off so that a crash loop does not burn the budget in seconds.
        backoff = 0.0 if restarts == 0 or preempted else min(
            MAX_BACKOFF, spec.restart_backoff * 2 ** (restarts - 1))
        if now - (arow["ended"] or now) < backoff:
            return
        if self.disk_full():
            self.fail_for_disk(job_id, f"not restarting after attempt {row['attempt']} "
                               f"({arow['reason']}); free space, then resume the job",
                               expect=("RESTARTING",))
            return
        attempt = self.store.new_attempt(job_id, f"restart after attempt {row['attempt']}: "
                                         f"{arow['reason']}", expect=("RESTARTING",))
        if attempt is None:
            return  # stopped meanwhile
        self.store.update_attempt(job_id, attempt, restarts=restarts + (0 if preempted else 1))
        self.wake.set()

    # -- stop, resume, clone ------------------------------------------------------------
    def request_stop(self, job_id: str, grace: float | None, reason: str = "stopped by the user") -> bool:
        """Stop a job in whatever state it is; returns False if it had ended already.

        A job with nothing of its attempt running (QUEUED, PREFLIGHT, RESTARTING) is STOPPED
        at once, and one still PENDING or STARTING gets no grace: its script has not begun to train.
        On a full disk the state change is written with the store's last reserve; where even
        that cannot hold it, the signals still went and the stop counts as done (the job's
        end is then the supervisor's, end_for_disk).

        Waits while the job's attempt starts (its engine's submit): the launcher runs this on
        an action worker, never on its event loop.
        """
        try:
            return self.store.write_verdict(lambda: self._request_stop(job_id, grace, reason))
        except Exception as error:
            if not is_disk_full(error):
                raise
            log.error("job %s: stop carried out, but not stored: %s", job_id, error)
            return True

    def _request_stop(self, job_id: str, grace: float | None, reason: str) -> bool:
        with self.lifecycle(job_id):
            for _ in range(10):  # lost a race with the supervisor's own move: look again
                row = self.store.job_row(job_id)
                if row is None or row["state"] in TERMINAL_STATES:
                    return False
                state = row["state"]
                spec = JobSpec.from_dict(json.loads(row["spec"]))
                grace = spec.stop_grace if grace is None else grace
                if state in ("QUEUED", "PREFLIGHT", "RESTARTING"):
                    if self.store.transition(job_id, "STOPPED", reason, expect=state,
                                             stop_requested=time.time()):
                        # Standby agents, and what a failed attempt may still have running.
                        self.kill_leftovers(job_id)
                        return True
                    continue
                if state in ("PENDING", "STARTING"):
                    grace = 0.0  # its script has not begun to train
                now = time.time()
                ctx = self.context(row)
                arow = self.store.attempt_row(job_id, ctx.attempt)
                engine, handle = get_engine(spec.engine), self.handle_of(ctx, arow)
                why = (f"{reason}: SIGTERM sent, SIGKILL after {grace:g}s" if grace
                       else f"{reason}: killed at once")
                # Recorded before the engine is asked: should the engine fail (a scancel that
                # times out), the stop still stands, and finish_stop kills once the grace is over.
                if not self.store.transition(job_id, "STOPPING", why, expect=state,
                                             stop_requested=now + grace):
                    continue
                self.wake.set()
                try:
                    if grace:
                        engine.stop(ctx, handle, grace)
                    else:
                        engine.kill(ctx, handle)
                except Exception:  # noqa: BLE001 - the grace-over kill of finish_stop follows
                    log.error("job %s: the engine's stop failed:\n%s", job_id, traceback.format_exc())
                return True
            return False

    def checkpoint_and_stop(self, job_id: str, reason: str) -> None:
        """Ask the ranks (through their next report's answer) to save and leave, then stop."""
        row = self.store.job_row(job_id)
        spec = JobSpec.from_dict(json.loads(row["spec"]))
        if self.store.transition(job_id, "STOPPING", f"{reason}: checkpoint requested, then stop",
                                 expect=("STARTING", "RUNNING"),
                                 stop_requested=time.time() + spec.stop_grace):
            self.pending.setdefault(job_id, set()).add("stop")

    def finish_stop(self, row, now: float) -> None:
        job_id = row["id"]
        ctx = self.context(row)
        arow = self.store.attempt_row(job_id, ctx.attempt)
        handle = self.handle_of(ctx, arow)
        engine = get_engine(ctx.spec.engine)
        status = engine.describe(ctx, handle)
        self.sync_ranks(ctx, status, status.alive)
        if status.alive and now < (row["stop_requested"] or 0):
            return
        if status.alive:
            engine.kill(ctx, handle)
            self.store.add_event(job_id, ctx.attempt, "state", "grace over: killing what is left")
            return
        if job_id not in self._seen_gone:
            # A process caught mid-exec shows no environment for an instant; without a cgroup
            # that is invisible to the scan. Gone in two scans a tick apart is gone.
            self._seen_gone.add(job_id)
            self.wake.set()
            return
        self._seen_gone.discard(job_id)
        note = self.stop_note(job_id, ctx.attempt)
        self.store.update_attempt(job_id, ctx.attempt, outcome="stopped", ended=now)
        self.pending.pop(job_id, None)
        note = f"; {note}" if note else ""
        self.kill_leftovers(job_id)  # standby agents for a next attempt, before it reads ended
        self._swept.add(job_id)
        self.store.transition(job_id, "STOPPED", f"stopped{note}", expect="STOPPING")

    def resume(self, job_id: str, step: int | None) -> bool:
        attempt = self.store.new_attempt(job_id, f"resumed by the user from "
                               f"{'step ' + str(step) if step is not None else 'the newest checkpoint'}",
                               resume_step=step)
        self.wake.set()
        return attempt is not None


def _hang_reason(ranks: dict, silent: float) -> tuple[str, list[int]]:
    """The progress verdict's reason. In a hang every rank waits in the same collective, so
    the time of each rank's last step says nothing about which one is stuck; only a rank
    whose last step is behind the others' is named."""
    stepped = [r for r in ranks.values() if r["last_progress"] and r["last_step"] is not None]
    if not stepped:
        return f"no step progress for {silent:.0f}s: a hang", []
    behind = min(r["last_step"] for r in stepped)
    ahead = max(r["last_step"] for r in stepped)
    if behind == ahead:
        return f"no step progress on any rank for {silent:.0f}s (all at step {behind}): a hang", []
    laggards = sorted(r["rank"] for r in stepped if r["last_step"] == behind)
    named = ", ".join(map(str, laggards[:8])) + (" ..." if len(laggards) > 8 else "")
    return (f"no step progress for {silent:.0f}s: rank{'s' if len(laggards) > 1 else ''} {named} "
            f"stuck at step {behind}, the others at step {ahead}: a hang"), laggards


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


def _submit_verb(engine: str) -> str:
    """What a refused submit is called in a reason: the engine's own command where it has one."""
    return {"slurm": "sbatch", "kubernetes": "the Kubernetes API", "ssh": "ssh"}.get(engine, f"{engine} submit")


def _on_host(engine, ctx, handle, node: int) -> str:
    """` on host H` where the engine knows which host a node ran on, for reasons that name it."""
    host = engine.node_host(ctx, handle, node)
    return f" on host {host}" if host else ""


def _sweep_of(row) -> dict | None:
    """The sweep a job is a trial of ({"id", "trial", "parallel"}), or None."""
    return json.loads(row["spec"]).get("sweep")


def _local_slots(row) -> int:
    """The process slots of this machine a job takes: a cluster engine's ranks run elsewhere."""
    spec = json.loads(row["spec"])
    if spec.get("engine", "local") != "local":
        return 0
    return int(spec.get("nodes") or 1) * int(spec.get("nproc_per_node") or 1)


def new_job_id(name: str) -> str:
    return f"{name[:40]}-{secrets.token_hex(3)}"
