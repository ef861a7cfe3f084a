"""Judging a running attempt (the supervisor's part that reads what the engine and the ranks
say, every tick): the engine's phase and reason, each rank's record and exit, a job whose
ranks all ended (succeeded, or failed with the first error), ranks that stopped
heartbeating or making progress (a hang, with the laggards named), standby agents for the
next attempt, and the diagnosis of a failure.

A mixin of `Supervisor` (supervisor.py); the verdicts it reaches are carried out by
`ending.py`.
"""

from __future__ import annotations

import json
import logging
import os
import traceback

from .. import layout
from ..engines.contract import (
    get_engine,
)

log = logging.getLogger("jupyter_dlc.launcher")

# After every rank reported a clean exit, an agent still alive this long is stuck in
# torchrun's exit barrier (see FIELD-NOTES): it is killed and the job still succeeds.
EXIT_BARRIER_GRACE = 5.0


# An attempt whose processes the engine no longer finds, and none of which left an exit
# record, counts as vanished once it has stayed so this long: a process caught between fork
# and exec shows no environment for an instant, and a tick right after the start (submits
# in a burst wake the supervisor again at once) would take a starting job for a dead one.
VANISHED_AFTER = 1.0


# Warm torchrun agents for the next attempt (see node/standby.py); each holds an imported
# torch (a few hundred MB) while it waits. DLC_STANDBY_AGENTS=0 turns them off.
STANDBY_AGENTS = os.environ.get("DLC_STANDBY_AGENTS", "1") != "0"


# A running job's ranks are read and judged every tick up to WATCH_EVERY_TICK ranks; a
# larger one less often, once a second at 4,096 ranks: reading and judging every rank five
# times a second was a sixth of the launcher's CPU there, for verdicts (heartbeats,
# progress) counted in seconds.
WATCH_EVERY_TICK = 1024


WATCH_RANKS_PER_SECOND = 4096


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


def _on_host(engine, ctx, handle, node: int) -> str:
    """` on host H` where the engine knows which host a node ran on, for reasons that name it."""
    host = engine.node_host(ctx, handle, node)
    return f" on host {host}" if host else ""



def _failures(status, now: float) -> tuple[list[int], list]:
    """The failed ranks, the first to fail first (the others usually die of its absence): by
    their own end time, a rank without one (its failure inferred from its node) last; and
    the nodes whose agent failed."""
    failed = sorted((r for r, rs in status.ranks.items() if rs.exit_code not in (None, 0)),
                    key=lambda r: (status.ranks[r].end or now, r))
    return failed, [n for n in status.nodes if n.exit_code not in (None, 0)]


class Judging:
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
        self._watched[job_id] = (now, self.sync_ranks(ctx, status, alive))
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
        failed, node_failed = _failures(status, now)
        if failed and status.ranks[failed[0]].end is None:
            # Known failed only from its node's exit (no record of its own yet): the rank that
            # failed first may have reported its record after this tick read the records and
            # before the engine saw the node end. Read them again, once, before naming anyone.
            ctx = self.context(row)
            status = engine.describe(ctx, handle)
            failed, node_failed = _failures(status, now)
        codes = [rs.exit_code for rs in status.ranks.values()]
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
        # Judged from two aggregates of the rank rows; every row is read only for a verdict.
        oldest_heartbeat, oldest_progress = self.store.liveness_of(job_id, ctx.attempt)
        self.check_liveness(row, ctx, handle, oldest_heartbeat, oldest_progress, now)
        if oldest_progress is not None:  # let the attempt's own start-up have the CPU first
            self.maybe_start_standby(row, ctx)

    def maybe_start_standby(self, row, ctx) -> None:
        """Once an attempt trains, warm the agents of the next one, if a restart may come."""
        engine = get_engine(ctx.spec.engine)
        if not STANDBY_AGENTS or row["state"] != "RUNNING" or \
                not engine.capabilities(ctx.spec).standby_agents:
            return
        restarts = self.store.attempt_row(row["id"], ctx.attempt)["restarts"] or 0
        if restarts >= ctx.spec.max_restarts:
            return
        engine.start_standby(self.context(row, ctx.attempt + 1))  # once per attempt

    def sync_ranks(self, ctx, status, alive: bool) -> int:
        """Copy what the engine knows of each rank into the store; returns how many ranks
        the attempt has."""
        job_id = ctx.job_id
        known_ranks = self.store.rank_states(job_id, ctx.attempt)
        for rank, rs in status.ranks.items():
            known = known_ranks.get(rank)
            if known is None:
                continue
            pid, exit_code, known_state = known
            state = ("running" if rs.running else "exited" if rs.exit_code == 0 else
                     "failed" if rs.exit_code is not None else known_state)
            if rs.exit_code is None and rs.pid and not rs.running and not alive:
                state = "lost"
            changes = {k: v for k, v, was in (("pid", rs.pid, pid), ("exit_code", rs.exit_code, exit_code),
                                              ("state", state, known_state)) if v is not None and was != v}
            if changes:
                self.store.update_rank(job_id, ctx.attempt, rank, **changes)
                if "exit_code" in changes:
                    self.store.add_event(job_id, ctx.attempt, "rank_exit",
                                         f"rank {rank} exited with code {rs.exit_code}",
                                         {"rank": rank, "exit_code": rs.exit_code})
        return len(known_ranks)

    def check_liveness(self, row, ctx, handle, oldest_heartbeat: float | None,
                       oldest_progress: float | None, now: float) -> None:
        spec = ctx.spec
        if spec.max_runtime and row["started"] and now - row["started"] > spec.max_runtime:
            self.end_attempt(row, ctx, handle, "timeout",
                             f"max runtime {spec.max_runtime:g}s exceeded")
            return
        verdict = spec.heartbeat_interval * spec.heartbeat_misses
        # Only ranks that use the runtime heartbeat; a plain script is judged by its exit.
        if oldest_heartbeat is not None and now - self.heard(oldest_heartbeat) > verdict:
            # heard() is the later of a heartbeat and this launcher's waking: every rank whose
            # heartbeat is older than the verdict's start is silent, the lowest one named.
            r = self.store.first_silent_rank(row["id"], ctx.attempt, now - verdict)
            if r is not None:
                rank = r["rank"]
                at = _on_host(get_engine(spec.engine), ctx, handle, rank // spec.nproc_per_node)
                self.end_attempt(row, ctx, handle, "failed",
                                 f"rank {rank}{at} missed {spec.heartbeat_misses} heartbeats "
                                 f"({now - r['last_heartbeat']:.0f}s silent): hung or stopped",
                                 hung=True)
                return
        if oldest_progress is not None and now - self.heard(oldest_progress) > spec.progress_timeout:
            ranks = {r["rank"]: r for r in self.store.rank_rows(row["id"], ctx.attempt)}
            reason, laggards = _hang_reason(ranks, now - oldest_progress)
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
            self.end_attempt(row, ctx, handle, "failed", reason, diagnosis=diagnosis, hung=True)
            return

    def heard(self, when: float) -> float:
        """When a rank last told us something, for judging its silence. While no launcher
        listened (this one started after a kill -9 or a restart of the user's), no rank
        could: its silence counts from when its reporter could first reach this launcher
        again (the reporter's longest retry backoff after this launcher came up)."""
        return max(when, self.awake_since + layout.REPORT_MAX_BACKOFF)

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

