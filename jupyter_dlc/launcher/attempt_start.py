"""Starting an attempt (the supervisor's part that moves a job QUEUED → PREFLIGHT → STARTING):
its context (the environment contract every rank gets), preflight, a warm pool or the
engine's submit from the engine's own dry run, the intent stored before the engine is asked
so that a launcher killed in between re-adopts instead of submitting twice, and the bounded
retries of a submit the engine refused for a reason that may pass.

A mixin of `Supervisor` (supervisor.py): it reads and writes the supervisor's store, pools
and per-job locks; split out so that each of the supervisor's jobs is one module.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
import traceback

from .. import identity, layout, paths
from ..engines.contract import (
    AttemptContext,
    SubmitError,
    get_engine,
)
from ..spec import params_env, JobSpec, network_env
from . import checkpoints
from .preflight import run_preflight

log = logging.getLogger("jupyter_dlc.launcher")

# A submit the engine refused for a reason that may pass (a timeout, a controller that does
# not answer) is tried again this many times, after SUBMIT_BACKOFF seconds, doubling each
# time (at most MAX_BACKOFF); a refusal the engine calls permanent ends the job at once.
SUBMIT_RETRIES = int(os.environ.get("DLC_SUBMIT_RETRIES", "5"))


SUBMIT_BACKOFF = float(os.environ.get("DLC_SUBMIT_BACKOFF", "2"))


MAX_BACKOFF = 60.0


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



class AttemptStart:
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
        what = f"{engine.submit_verb or engine.name + ' submit'} refused"
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

