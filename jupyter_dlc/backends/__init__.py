"""Engines behind one contract (after TorchX's scheduler contract).

    capacity_error(spec)      why the engine cannot run this spec at all (checked at submit)
    dry_run(ctx)              the engine's native request (argv per node, an sbatch script,
                              manifests), without starting anything: what `export` writes
    submit(ctx) -> handle     start one attempt; the JSON-able handle (pids, a Slurm job id)
                              is stored, so a restarted launcher re-adopts the attempt. The
                              engine job is named `engine_job_name(ctx)` (the supervisor stored
                              that intent first); a refusal raises SubmitError, permanent or not
    adopt(ctx) -> handle      find an attempt whose handle was never stored (a launcher killed
                              between submit and store) by that name (squeue --name, labels,
                              the keepers' environment): one that runs is adopted and any
                              duplicate cancelled; None where nothing of it is there
    describe(ctx, handle)     phase PENDING | RUNNING | ENDED, the engine's own reason (Slurm's
                              pending reason, "CANCELLED"), per-node and per-rank exits, and
                              whether anything of the attempt is still alive
    logs(ctx, handle, ...)    a rank's or a node's log lines, from an offset (follow = call again)
    stop(ctx, handle, grace)  the polite stop (SIGTERM to every rank); the supervisor calls
    kill(ctx, handle)         once the grace is over, or at once for a failed attempt
    cleanup(ctx, handle)      release whatever the attempt still holds once the job has ended
    checkpoint_dir(spec, ...) where the launcher finds the checkpoints the ranks commit
    capabilities(spec)        what the supervisor may count on: standby agents, a filesystem
                              shared with the ranks, signals to one rank
    refresh()                 once per supervisor tick, before any describe: engines that
                              poll something shared (a /proc scan) take one snapshot here
    leftover_jobs()           ids of jobs the engine still holds something of (processes,
                              cgroups), as of the last refresh: the supervisor sweeps ended ones
    kill_leftovers(job_id)    an ended or deleted job keeps nothing: every attempt's processes,
                              standby agents included, and what the engine keeps for them
    release_all(is_ours)      at the launcher's exit: let go what belongs to no running job
    check(profile)            a live check of a cluster profile (reachable, idle nodes, GPUs)
    node_host(ctx, handle, n) the host node n runs on, so failure reasons can name it

Engines are singletons (`get_backend`); per-job options come from the job's cluster profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec import JobSpec


class SubmitError(RuntimeError):
    """An engine refused to start an attempt, in its own words. `permanent`: the same
    request can never succeed (an unknown partition, more nodes than there are), so the job
    ends FAILED; otherwise (a timeout, a controller or API server that does not answer) the
    supervisor retries with backoff, a bounded number of times."""

    def __init__(self, message: str, permanent: bool):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


def engine_job_name(job_id: str, attempt: int) -> str:
    """The name an attempt's engine job gets (a Slurm job name): recorded as the attempt's
    intent before the submit, so that a launcher killed between the submit and storing the
    handle finds the job by it instead of submitting a second one."""
    return f"dlc-{job_id}-a{attempt}"


@dataclass
class AttemptContext:
    """Everything an engine needs to start one attempt of a job."""

    job_id: str
    attempt: int
    spec: JobSpec
    job_dir: str
    attempt_dir: str
    script_path: str
    env: dict[str, str]
    port: int
    # What the attempt's ranks reported about themselves over the report route (events of
    # `layout.RECORD_EVENTS`, oldest first); the supervisor fills it before each describe.
    reported: list[dict[str, Any]] = field(default_factory=list)

    @property
    def engine_name(self) -> str:
        return engine_job_name(self.job_id, self.attempt)


@dataclass
class NodeStatus:
    node: int
    running: bool
    exit_code: int | None = None
    host: str | None = None  # where the node runs, when the engine knows (SSH hosts)


@dataclass
class RankStatus:
    rank: int
    pid: int | None = None
    running: bool = False
    exit_code: int | None = None
    start: float | None = None
    end: float | None = None


PHASES = ("PENDING", "RUNNING", "ENDED")


@dataclass
class AttemptStatus:
    nodes: list[NodeStatus] = field(default_factory=list)
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    # PENDING: queued by the engine (reason says why); RUNNING: allocated, processes may run;
    # ENDED: the engine holds nothing more. `reason` is the engine's word, set when the
    # engine (not a rank) decided: a pending reason, or who ended the attempt (scancel).
    phase: str = "RUNNING"
    reason: str | None = None
    # Whether any process (or allocation) of the attempt is left, as the engine sees it.
    alive: bool = False

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)


def _can(feature: str, default: bool = False) -> Any:
    """A capability: `feature` is its row in ARCHITECTURE.md's engine-by-feature table
    (generated by `python -m jupyter_dlc.backends.features`, checked by a test)."""
    return field(default=default, metadata={"feature": feature})


@dataclass
class Capabilities:
    """What the launcher may count on from an engine for one job's spec and profile."""

    standby_agents: bool = _can("Warm restarts: a standby agent per node, torch imported, "
                                "takes the next attempt")
    # DLC_NODE_COPY: each rank keeps the newest committed step in shared memory on its node,
    # which only a restart on the same nodes (a standby agent's) can read back.
    node_copies: bool = _can("Restore from a node-held shared-memory copy of the newest step")
    warm_pools: bool = _can("Warm pools (`pool up`): the next cell's ranks fork from agents "
                            "that are already up")
    shared_filesystem: bool = _can("The nodes see the launcher's job directory "
                                   "(else scripts travel with the job, logs come back)", True)
    per_rank_signals: bool = _can("One rank can be signalled alone")
    # The engine runs preflight on its nodes (runtime.node_preflight: torch, the shared
    # checkpoint directory), so the launcher's own host checks say nothing and are skipped.
    node_preflight: bool = _can("Preflight runs on the nodes themselves")
    # `--from JOB@STEP` plants the parent's step in the new job's checkpoint directory, which
    # the launcher must therefore see where the ranks do (launcher/branches.py).
    branches: bool = _can("Branch from another job's committed step (--from JOB@STEP)", True)
    # --workdir is a directory of the submitting machine; a pod runs in its image's working
    # directory, which need not have that path (the job directory is /dlc/job there).
    workdir: bool = _can("The ranks run in the job's --workdir", True)
    # Something outside the launcher decides at submit (sbatch, the API server, sshd) and can
    # say no: the job ends FAILED with that refusal's own words. The local engine has nobody
    # to refuse; what it cannot run the launcher refuses at once (400, no job stored).
    submit_refusals: bool = _can("A submit the engine refuses ends FAILED in the engine's own words", True)


class Backend:
    name = "base"

    def capabilities(self, spec: JobSpec) -> Capabilities:
        return Capabilities()

    def capacity_error(self, spec: JobSpec) -> str | None:
        """A reason this engine cannot run `spec` at all, checked at submit time."""
        return None

    def checkpoint_dir(self, spec: JobSpec, job_id: str, job_dir: str) -> str:
        """Where the launcher finds the checkpoints the job's ranks commit (it picks the resume
        step there): the spec's, else the job directory's."""
        from .. import layout

        return spec.checkpoint_dir or layout.default_checkpoint_dir(job_dir)

    def dry_run(self, ctx: AttemptContext) -> dict[str, Any]:
        raise NotImplementedError

    def submit(self, ctx: AttemptContext) -> dict[str, Any]:
        raise NotImplementedError

    def adopt(self, ctx: AttemptContext) -> dict[str, Any] | None:
        return None

    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        raise NotImplementedError

    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        raise NotImplementedError

    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        raise NotImplementedError

    def cleanup(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        """Release what an ended job's attempt may still hold; nothing by default."""

    def refresh(self) -> None:
        """Called once per supervisor tick before any `describe`."""

    def leftover_jobs(self) -> set[str]:
        return set()

    def kill_leftovers(self, job_id: str) -> None:
        """Nothing by default: `kill` and `cleanup` reach everything an attempt holds."""

    def release_all(self, is_ours) -> None:
        """Nothing by default."""

    def start_standby(self, ctx: AttemptContext) -> None:
        raise NotImplementedError(f"{self.name}: no standby agents")

    def check(self, profile) -> dict[str, Any]:
        return {"ok": True, "detail": "nothing to check"}

    def node_host(self, ctx: AttemptContext, handle: dict[str, Any], node: int) -> str | None:
        """The host a node of the attempt runs on, for reasons that name it (None: unknown)."""
        return None

    def logs(self, ctx: AttemptContext, handle: dict[str, Any], rank: int | None = None,
             offset: int = 0) -> tuple[list[str], int]:
        """Lines of one rank's log (or every node's agent log when rank is None, from node
        0's), from byte `offset`; returns (lines, next offset). Engines whose ranks share the
        launcher's filesystem read the attempt directory; others override this."""
        from .. import layout

        path = (layout.rank_log(ctx.attempt_dir, rank) if rank is not None
                else layout.node_log(ctx.attempt_dir, 0))
        return layout.read_log_lines(path, offset, 1 << 62)


def reported_records(events: list[dict[str, Any]]) -> tuple[dict[int, dict], dict[int, dict]]:
    """The records ranks reported, shaped as the files the bootstrap writes where the job
    directory is shared: (rank -> rank-R.json's record, rank -> rank-R.error.json's)."""
    from .. import layout

    records: dict[int, dict] = {}
    errors: dict[int, dict] = {}
    for event in events:
        rank = event.get("rank")
        if not isinstance(rank, int):
            continue
        kind = event.get("type")
        if kind in (layout.RANK_START, layout.RANK_END):
            record = records.setdefault(rank, {"rank": rank})
            record.update({k: event[k] for k in ("pid", "node", "local_rank", "start", "end",
                                                 "exit_code") if event.get(k) is not None})
        elif kind == layout.RANK_ERROR and rank not in errors:
            errors[rank] = {"t": event.get("t"), "rank": rank, "node": event.get("node"),
                            "type": event.get("error") or "Error",
                            "message": event.get("message") or "",
                            "traceback": event.get("traceback") or ""}
    return records, errors


def failed_preflight(events: list[dict[str, Any]]) -> str | None:
    """The first node preflight that failed (reported by `runtime.node_preflight`), as the
    reason the attempt ends with; None while every node that answered is fit."""
    from .. import layout

    for event in events:
        if event.get("type") == layout.NODE_PREFLIGHT and event.get("ok") is False:
            return f"preflight on {event.get('message') or 'node ' + str(event.get('node'))}"
    return None


def remove_preflight_markers(ctx: AttemptContext) -> None:
    """Preflight markers that node 0 did not live to remove (the attempt ended mid-check)."""
    import glob
    import os

    from .. import layout

    marker = layout.preflight_marker(ctx.env["DLC_CHECKPOINT_DIR"], ctx.job_id, "*")
    for path in glob.glob(marker) + glob.glob(marker + ".ok-*"):
        try:
            os.remove(path)
        except OSError:
            pass


def rank_records(ctx: AttemptContext) -> dict[int, dict]:
    """Every rank's record: the attempt directory's file where the ranks wrote one (the
    local engine's fast path, and readable while the launcher was down), over what the
    rank reported through the report route (the only source without a shared filesystem)."""
    from .. import layout

    reported, _ = reported_records(ctx.reported)
    return {rank: {**reported.get(rank, {}), **(layout.read_json(layout.rank_json(ctx.attempt_dir, rank)) or {})}
            for rank in range(ctx.spec.world_size)}


_engines: dict[str, Backend] = {}
# The URL ranks report to, as the launcher advertises it (set when the launcher starts):
# engines whose ranks run on other hosts refuse a job that could not reach it.
launcher_url: str | None = None


def get_backend(name: str) -> Backend:
    if name not in _engines:
        if name == "local":
            from .local import LocalBackend

            _engines[name] = LocalBackend()
        elif name == "slurm":
            from .slurm import SlurmBackend

            _engines[name] = SlurmBackend()
        elif name == "kubernetes":
            from .kubernetes import KubernetesBackend

            _engines[name] = KubernetesBackend()
        elif name == "ssh":
            from .ssh import SSHBackend

            _engines[name] = SSHBackend()
        else:
            raise ValueError(f"backend: {name!r} is not available here; use 'local' or a "
                             "Slurm cluster profile (--cluster NAME)")
    return _engines[name]


def refresh_backends() -> None:
    """One snapshot per engine in use, at the start of a supervisor tick."""
    for engine in list(_engines.values()):
        engine.refresh()


def leftover_jobs() -> set[str]:
    """Jobs that some engine in use still holds something of (see `Backend.leftover_jobs`)."""
    return set().union(*(engine.leftover_jobs() for engine in list(_engines.values())))


def kill_leftovers(job_id: str) -> None:
    """Whatever of the job any engine in use still holds goes (an ended or deleted job)."""
    for engine in list(_engines.values()):
        engine.kill_leftovers(job_id)


def release_all(is_ours) -> None:
    for engine in list(_engines.values()):
        engine.release_all(is_ours)


def bind_cluster(spec: JobSpec) -> JobSpec:
    """The spec with its engine taken from its cluster profile (at submit time)."""
    if spec.cluster is None:
        return spec
    from ..clusters import get_profile
    from ..spec import SpecError

    profile = get_profile(spec.cluster)
    if spec.backend not in ("local", profile.engine):
        raise SpecError("backend", f"{spec.backend!r} conflicts with cluster {spec.cluster!r} "
                        f"(engine {profile.engine}); drop --backend")
    spec.backend = profile.engine
    return spec
