"""The local engine: one torchrun agent per simulated node, all on this machine (its processes
found, admitted, signalled and killed as `hostprocs` does for every engine that runs here).
Its warm pool's driver is `pool.py`; standby agents for a job's next attempt are
`node/standby.py`.
"""

from __future__ import annotations

import os
import signal as signals
import sys
import time
from typing import Any

from ... import layout, shell
from ...node import reporter as node_reporter
from ...spec import JobSpec
from ..contract import (
    AttemptContext,
    AttemptStatus,
    Capabilities,
    DryRun,
    Engine,
    NodeStatus,
    Phase,
    RankStatus,
)
from ...hostprocs import (
    LEFTOVER_WAIT,
    alive,
    attempt_cgroup,
    available_memory,
    cgroup_jobs,
    job_processes,
    kill_job,
    process_slots,
    release_cgroups,
    visible_gpus,
)
from ..children import spawn
from ..torchrun import agent_summary_codes, node_agent_argv

# Exit code recorded for a rank that vanished without one: 128 + SIGKILL, the usual cause.
KILLED = 137
VANISHED_GRACE = 1.0  # seconds; torchrun's own verdict usually comes within 0.2 s
_vanished: dict[tuple[str, int, int], float] = {}


class LocalEngine(Engine):
    name = "local"
    ranks_here = True

    def capacity_error(self, spec: JobSpec) -> str | None:
        wanted = spec.resources
        if wanted.get("gpus") and wanted["gpus"] > visible_gpus():
            return (f"resources.gpus: {wanted['gpus']} GPUs per node but this machine has "
                    f"{visible_gpus()}; ask for fewer, or run on a cluster (--cluster NAME)")
        if wanted.get("cpus") and wanted["cpus"] > (os.cpu_count() or 1):
            return (f"resources.cpus: {wanted['cpus']} CPUs per node but this machine has "
                    f"{os.cpu_count()}; ask for fewer, or run on a cluster (--cluster NAME)")
        if spec.nodes * spec.nproc_per_node > 1 and visible_gpus() and \
                spec.nproc_per_node > visible_gpus():
            return (f"nproc_per_node: {spec.nproc_per_node} processes per node but this machine has "
                    f"{visible_gpus()} GPUs; use --nproc-per-node {visible_gpus()} or fewer")
        procs = spec.nodes * spec.nproc_per_node
        limit, why = process_slots()
        if procs > limit:
            return (f"nodes x nproc_per_node: {procs} processes exceed what this machine can run "
                    f"({limit}: {why}); ask for fewer, or run on a cluster (--cluster NAME)")
        return None

    def dry_run(self, ctx: AttemptContext) -> DryRun:
        python = ctx.spec.python or sys.executable
        commands = [node_agent_argv(ctx.spec, node, ctx.port, ctx.script_path, python,
                                    layout.node_exit(ctx.attempt_dir, node))
                    for node in range(ctx.spec.nodes)]
        return DryRun("local", commands=commands, cwd=ctx.spec.workdir or ctx.job_dir,
                      env=dict(ctx.env))

    def start_standby(self, ctx: AttemptContext) -> None:
        """Warm agents for attempt `ctx.attempt`, started while the attempt before it runs
        (once: not while processes of that attempt exist, nor after they died or were used)."""
        if (self.snapshot or {}).get((ctx.job_id, ctx.attempt)) or self.standby_started(ctx):
            return
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        python = ctx.spec.python or sys.executable
        for node in range(ctx.spec.nodes):
            pid = spawn(ctx, node, [python, "-m", "jupyter_dlc.node.standby",
                                     _go_file(ctx, node), layout.node_exit(ctx.attempt_dir, node)])
            with open(_go_file(ctx, node) + ".pid", "w") as f:
                f.write(str(pid))

    def standby_started(self, ctx: AttemptContext) -> bool:
        return os.path.exists(_go_file(ctx, 0) + ".pid")

    def _standbys(self, ctx: AttemptContext) -> list[int] | None:
        """Pids of a standby agent for every node of this attempt, if all are alive."""
        pids = []
        for node in range(ctx.spec.nodes):
            pid = layout.read_int(_go_file(ctx, node) + ".pid")
            if pid is None or not alive(pid):
                return None
            pids.append(pid)
        return pids

    def submit(self, ctx: AttemptContext, request: DryRun) -> dict[str, Any]:
        standbys = self._standbys(ctx)
        if standbys:
            for node, argv in enumerate(request.commands):
                # The standby is torchrun's agent: its order is torchrun's arguments. The env
                # holds the attempt's token.
                layout.write_json(_go_file(ctx, node), {"args": _torchrun_args(argv), "env": dict(
                    ctx.env, DLC_NODE_RANK=str(node))}, mode=0o600)
            return {"nodes": [{"node": n, "pid": pid} for n, pid in enumerate(standbys)],
                    "standby": True}
        nodes = []
        for node, argv in enumerate(request.commands):
            exit_path = layout.node_exit(ctx.attempt_dir, node)
            # The shell outlives torchrun only to record its exit code, which a launcher that
            # restarted meanwhile could not learn from waitpid.
            wrapper = f'{shell.command(argv)}; echo $? > {shell.quote(exit_path)}'
            if node_reporter.wanted(ctx.spec.nproc_per_node):
                # The node's ranks report through one node reporter, which leaves with this shell.
                wrapper = node_reporter.shell_start(
                    shell.quote(argv[0]),
                    shell.quote(node_reporter.url_file(ctx.attempt_dir, node))) + wrapper
            nodes.append({"node": node, "pid": spawn(ctx, node, ["/bin/sh", "-c", wrapper])})
        return {"nodes": nodes}

    def poll(self, ctx: AttemptContext, handle: dict[str, Any],
             processes: dict[tuple[str, int], list[int]] | None = None) -> AttemptStatus:
        if processes is None:
            processes = job_processes()
        live = set(processes.get((ctx.job_id, ctx.attempt), []))
        status = AttemptStatus()
        for node in range(ctx.spec.nodes):
            exit_code = layout.read_int(layout.node_exit(ctx.attempt_dir, node))
            pid = next((n["pid"] for n in handle.get("nodes", []) if n["node"] == node), None)
            running = exit_code is None and pid is not None and pid in live
            status.nodes.append(NodeStatus(node, running, exit_code))
        summary_codes = self._agent_summary_codes(ctx)
        peers_failing = None  # looked up only when a rank vanished
        for rank in range(ctx.spec.world_size):
            record = layout.read_json(layout.rank_json(ctx.attempt_dir, rank)) or {}
            pid = record.get("pid")
            exit_code = record.get("exit_code")
            if exit_code is None and rank in summary_codes:
                exit_code = summary_codes[rank]
            if exit_code is None and status.nodes[rank // ctx.spec.nproc_per_node].exit_code == 0:
                # The script left with os._exit before the bootstrap could record it; torchrun
                # exits 0 only when every worker of its node did.
                exit_code = 0
            running = exit_code is None and pid is not None and pid in live
            if exit_code is None and pid is not None and not running and not alive(pid):
                # Gone without a record: a script that left with os._exit (its agent's exit
                # code will say 0), or a kill (torchrun's summary names the signal, or never
                # comes if the agent hangs). Past a short wait for either, it was a kill.
                # No wait when a peer already failed with an exception: the attempt fails
                # either way, and peers blocked in a collective with the vanished rank fail
                # within milliseconds of its death (gloo: "Connection reset by peer").
                if peers_failing is None:
                    peers_failing = _ranks_with_errors(ctx)
                key = (ctx.job_id, ctx.attempt, rank)
                first_seen = _vanished.setdefault(key, time.monotonic())
                if time.monotonic() - first_seen > VANISHED_GRACE or peers_failing - {rank}:
                    exit_code = KILLED
            status.ranks[rank] = RankStatus(rank, pid, running, exit_code, record.get("start"),
                                            record.get("end"))
        return status

    def _agent_summary_codes(self, ctx: AttemptContext) -> dict[int, int]:
        return agent_summary_codes(ctx.attempt_dir, ctx.spec.nodes)

    def signal(self, ctx: AttemptContext, handle: dict[str, Any], sig: int,
               processes: dict[tuple[str, int], list[int]] | None = None) -> int:
        if processes is None:
            processes = job_processes()
        count = 0
        cgroup = attempt_cgroup(ctx.job_id, ctx.attempt)
        if cgroup and sig == signals.SIGKILL:
            # All at once: nothing of the attempt can fork away between two kills.
            try:
                with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass
        for pid in processes.get((ctx.job_id, ctx.attempt), []):
            try:
                os.kill(pid, sig)
                count += 1
            except ProcessLookupError:
                pass
        return count

    # -- the engine contract over the methods above (see engines/contract.py) -------------
    snapshot: dict[tuple[str, int], list[int]] | None = None
    # Jobs with a process that outlived a whole LEFTOVER_WAIT after SIGKILL (stuck in the
    # kernel, e.g. on a hung NFS mount): killed again each sweep, never waited for again, or
    # every supervisor tick would stall for them.
    outlived: set[str] = set()

    def capabilities(self, spec: JobSpec) -> Capabilities:
        return Capabilities(standby_agents=True, node_copies=True, warm_pools=True,
                            shared_filesystem=True, per_rank_signals=True,
                            submit_refusals=False)

    def refresh(self) -> None:
        self.snapshot = job_processes()

    def pool_driver(self, options: dict[str, Any] | None):
        from .pool import LocalPoolDriver

        return LocalPoolDriver()

    def leftover_jobs(self) -> set[str]:
        processes = self.snapshot if self.snapshot is not None else job_processes()
        return {job for job, _ in processes} | cgroup_jobs()

    def kill_leftovers(self, job_id: str) -> None:
        # The tick's snapshot at once (a job seen ended must not show a process a moment
        # later), then a fresh scan: what started since, or a call from the HTTP thread.
        if self.snapshot is not None:
            kill_job(job_id, self.snapshot)
        kill_job(job_id, job_processes())
        # SIGKILL is delivered at once, but a rank that held a few hundred MB of torch takes
        # tens of milliseconds more to leave, longer on a loaded machine: wait (bounded) until
        # it has, so that a job seen ended has left nothing running.
        # Gone in two scans in a row is gone: a process caught mid-exec shows no environment
        # for an instant.
        deadline, empty = time.monotonic() + LEFTOVER_WAIT, 0
        while empty < 2 and job_id not in self.outlived:
            left = {key: pids for key, pids in job_processes().items() if key[0] == job_id}
            empty = 0 if left else empty + 1
            kill_job(job_id, left)  # and anything forked since the first kill
            if left and time.monotonic() > deadline:
                self.outlived = self.outlived | {job_id}
                print(f"jupyter-dlc: job {job_id}: process(es) {sorted(p for v in left.values() for p in v)} "
                      f"still there {LEFTOVER_WAIT:g}s after SIGKILL (stuck in the kernel?); "
                      "killing them again each sweep without waiting", file=sys.stderr, flush=True)
            time.sleep(0.01)
        release_cgroups(job_id)

    def release_all(self, is_ours) -> None:
        """Remove the empty cgroups of our jobs (a running job's stays, with its processes,
        for the next launcher to adopt)."""
        for job_id in cgroup_jobs():
            if is_ours(job_id):
                release_cgroups(job_id)

    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        processes = self.snapshot if self.snapshot is not None else job_processes()
        status = self.poll(ctx, handle, processes)
        status.alive = bool(processes.get((ctx.job_id, ctx.attempt)))
        status.phase = Phase.RUNNING if status.alive or status.running else Phase.ENDED
        return status

    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        self.signal(ctx, handle, TERM)

    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        self.signal(ctx, handle, KILL, self.snapshot)

    def check(self, profile) -> dict[str, Any]:
        gpus = visible_gpus()
        return {"ok": True, "idle_nodes": 1, "gpus": gpus,
                "detail": f"this machine: {os.cpu_count()} CPUs, {available_memory() >> 30} GB free"}


def _ranks_with_errors(ctx: AttemptContext) -> set[int]:
    """Ranks of the attempt whose bootstrap recorded an exception (`rank-R.error.json`)."""
    return {rank for rank in range(ctx.spec.world_size)
            if os.path.exists(layout.rank_error_json(ctx.attempt_dir, rank))}


def _go_file(ctx: AttemptContext, node: int) -> str:
    return os.path.join(ctx.attempt_dir, f"node-{node}.go")


def _torchrun_args(argv: list[str]) -> list[str]:
    """torchrun's own arguments in a node's command line (plain or a cold start's)."""
    return argv[argv.index("torch.distributed.run") + 1:]






TERM, KILL = signals.SIGTERM, signals.SIGKILL
