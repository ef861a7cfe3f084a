"""Ending an attempt and what follows (the supervisor's part that carries out verdicts): the
evidence folder kept before a kill, the kill, the job's end or its restart with backoff from
the newest committed step (past a corrupt one), a full disk's end, and a user's stop
(SIGTERM, grace, SIGKILL; checkpoint-and-stop) and resume.

A mixin of `Supervisor` (supervisor.py).
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback

from ..engines.contract import (
    get_engine,
)
from ..spec import JobSpec
from . import checkpoints
from .storage import is_disk_full
from .attempt_start import MAX_BACKOFF
from .judging import _on_host
from .store import ACTIVE_STATES, TERMINAL_STATES

log = logging.getLogger("jupyter_dlc.launcher")
# How soon the loop looks again at a restarting attempt whose killed processes were still there.
RESTART_LOOK = 0.02


class Ending:
    # -- ending an attempt --------------------------------------------------------------
    def end_attempt(self, row, ctx, handle, outcome: str, reason: str,
                    diagnosis: dict | None = None, hung: bool = False) -> None:
        """End an attempt with `outcome`; `hung`: a hang verdict (no progress or no
        heartbeat) rather than a crash, whose evidence then includes native stacks."""
        job_id = row["id"]
        engine = get_engine(ctx.spec.engine)
        full = self.store.job_row(job_id) or row  # `row` may be a tick's, without the alert state
        for hook in self.hooks:
            hook(full, time.time(), final=True)
        if outcome == "failed":
            self.keep_scene(ctx, engine, reason, hung)
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

    def keep_scene(self, ctx, engine, reason: str, hung: bool) -> None:
        """The evidence folder of an attempt about to be killed (evidence.py): bounded in
        time and size, and never in the way of the kill."""
        from .evidence import keep_scene

        try:
            stacks = {e["data"]["rank"]: e["data"] for e in self.store.events(ctx.job_id, types=("stacks",))
                      if e["attempt"] == ctx.attempt and e["data"]}
            live = {r["rank"]: r["pid"] for r in self.store.rank_rows(ctx.job_id, ctx.attempt)
                    if r["exit_code"] is None and r["pid"]}
            index = keep_scene(ctx.attempt_dir, ctx.attempt, reason, ctx.spec.nodes * ctx.spec.nproc_per_node,
                               stacks, live, engine.ranks_here, hung)
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

    def maybe_restart(self, row, now: float) -> None:
        job_id = row["id"]
        arow = self.store.attempt_row(job_id, row["attempt"])
        ctx = self.context(row)
        handle = self.handle_of(ctx, arow)
        engine = get_engine(ctx.spec.engine)
        if engine.describe(ctx, handle).alive:
            engine.kill(ctx, handle)
            # SIGKILLed processes leave within milliseconds (a rank holding GBs, tens of
            # them): look again then, not a tick later (recovery time is what users feel).
            self.look_soon(RESTART_LOOK)
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

