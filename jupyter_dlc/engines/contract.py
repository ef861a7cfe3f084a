"""Engines behind one contract (after TorchX's scheduler contract).

    capacity_error(spec)      why the engine cannot run this spec at all (checked at submit)
    dry_run(ctx) -> DryRun    the engine's native request (argv per node, an sbatch script,
                              manifests), without starting anything: what `--dry-run` prints
    submit(ctx, request)      start one attempt from the DryRun `dry_run` made (as TorchX's
       -> handle              schedule(submit_dryrun(...))); the JSON-able handle (pids, a Slurm job id)
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
    logs(ctx, handle, ...)    a rank's or a node's log lines, from an offset (follow = call again):
                              what the logs route and the alert rules read
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
    pool_driver(options)      the engine's warm-pool driver (PoolDriver), or why jobs start cold
    standby_started(ctx)      whether standby agents were started for this attempt
    check(profile)            a live check of a cluster profile (reachable, idle nodes, GPUs)
    node_host(ctx, handle, n) the host node n runs on, so failure reasons can name it
    export_files(spec, ...)   the engine's form of an exported bundle (job.sbatch, manifests):
                              files that run the job from the bundle without the launcher

Engines are registered by entry point (engines.py) and made once each (`get_engine`);
per-job options come from the job's cluster profile. dry_run, submit, describe, stop and
kill are abstract: every engine writes them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from ..spec import JobSpec
from .. import engine_registry
from ..engine_registry import Option


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


class Phase(str, Enum):
    """Where an attempt stands as its engine sees it (`AttemptStatus.phase`)."""

    PENDING = "PENDING"  # queued by the engine; the reason says why
    RUNNING = "RUNNING"  # allocated: processes may run
    ENDED = "ENDED"  # the engine holds nothing more of it


PHASES = tuple(p.value for p in Phase)


@dataclass
class AttemptStatus:
    nodes: list[NodeStatus] = field(default_factory=list)
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    # PENDING: queued by the engine (reason says why); RUNNING: allocated, processes may run;
    # ENDED: the engine holds nothing more. `reason` is the engine's word, set when the
    # engine (not a rank) decided: a pending reason, or who ended the attempt (scancel).
    phase: Phase = Phase.RUNNING
    reason: str | None = None
    # Whether any process (or allocation) of the attempt is left, as the engine sees it.
    alive: bool = False

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)  # a misspelt phase fails here, not in the supervisor

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)


@dataclass
class DryRun:
    """What an engine would submit for one attempt, without starting anything (TorchX's
    AppDryRunInfo): `--dry-run` prints it, `submit` takes it. `commands`: the command lines
    in the order they would run (torchrun per node; `ssh HOST ...` per host, `hosts[i]`
    naming each; sbatch with the script), each shown under its `labels[i]` (default: the
    node and its host); `files`: the documents sent (`job.sbatch`, the
    manifests as YAML); `env` and `cwd`: what the nodes' processes get where the engine
    starts them itself; `native`: what only this engine's `submit` reads (the SSH nodes'
    payloads, the manifests as objects), shown as JSON."""

    engine: str
    cluster: str | None = None
    commands: list[list[str]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    native: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The wire form (the OpenAPI document's DryRun.request)."""
        return dataclasses.asdict(self)


def _can(feature: str, default: bool = False, shown: bool = True) -> Any:
    """A capability: `feature` is its row in ARCHITECTURE.md's engine-by-feature table
    (generated by `python -m jupyter_dlc.engines.features`, checked by a test). `shown`: a
    user misses it where it is absent, so the views say so (else it is how the engine works,
    not something it lacks: preflight on the nodes, one rank signalled alone)."""
    return field(default=default, metadata={"feature": feature, "shown": shown})


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
                                   "(else scripts travel with the job, logs come back)", True, shown=False)
    per_rank_signals: bool = _can("One rank can be signalled alone", shown=False)
    # The engine runs preflight on its nodes (runtime.node_preflight: torch, the shared
    # checkpoint directory), so the launcher's own host checks say nothing and are skipped.
    node_preflight: bool = _can("Preflight runs on the nodes themselves", shown=False)
    # `--from JOB@STEP` plants the parent's step in the new job's checkpoint directory, which
    # the launcher must therefore see where the ranks do (launcher/branches.py).
    branches: bool = _can("Branch from another job's committed step (--from JOB@STEP)", True)
    # --workdir is a directory of the submitting machine; a pod runs in its image's working
    # directory, which need not have that path (the job directory is /dlc/job there).
    workdir: bool = _can("The ranks run in the job's --workdir", True)
    # Something outside the launcher decides at submit (sbatch, the API server, sshd) and can
    # say no: the job ends FAILED with that refusal's own words. The local engine has nobody
    # to refuse; what it cannot run the launcher refuses at once (400, no job stored).
    submit_refusals: bool = _can("A submit the engine refuses ends FAILED in the engine's own words", True,
                                 shown=False)


class PoolDriver(ABC):
    """How one engine holds a warm pool: its agents (zygotes that fork each job's ranks,
    `pool_agent.py`) in a directory of the pool's, and what the launcher may see of them.
    `launcher/pools.py` keeps the policy (shapes, idle time, who may use a pool) and asks the
    driver for the rest; the hand-off of a job (`pool.submit`) is the same file protocol
    for every driver. `here`: the agents run on this machine, so their pids and the jobs'
    processes can be looked at and signalled from the launcher."""

    here = False

    @abstractmethod
    def start(self, directory: str, record: dict[str, Any], env: dict[str, str]) -> str | None:
        """Start the pool's agents; the engine's id of what holds them (a Slurm allocation)."""

    @abstractmethod
    def broken(self, directory: str, record: dict[str, Any]) -> str | None:
        """Why the pool must be replaced (an agent died, its allocation ended), or None."""

    def snapshot(self) -> dict:
        """One look at what runs, shared by every pool of this driver in a tick."""
        return {}

    @abstractmethod
    def job_left(self, record: dict[str, Any], snapshot: dict, ended: bool) -> bool:
        """Whether nothing of the pool's last job runs any more; `ended`: the job has ended
        (its leftovers may be killed)."""

    @abstractmethod
    def kill_job(self, ctx: AttemptContext) -> None:
        """A job the pool took only in part: its processes go."""

    @abstractmethod
    def release(self, directory: str, record: dict[str, Any]) -> None:
        """End the pool's agents (and what holds them) and remove `directory`."""


def capability_report(spec: JobSpec) -> dict[str, Any]:
    """What the job's engine can and cannot do for it, as the views show it: every
    capability's value, and the features it lacks in the words of the engine-by-feature
    table (a disabled button says why, a line lists them)."""
    import dataclasses

    try:
        can = get_engine(spec.engine).capabilities(spec)
    except (ValueError, OSError) as error:  # an engine no longer installed, a profile gone
        return {"name": spec.engine, "capabilities": {}, "cannot": [], "error": str(error)}
    values = {f.name: bool(getattr(can, f.name)) for f in dataclasses.fields(can)}
    cannot = [{"capability": f.name, "feature": f.metadata["feature"]}
              for f in dataclasses.fields(can) if not values[f.name] and f.metadata.get("shown")]
    return {"name": spec.engine, "capabilities": values, "cannot": cannot}


class Engine(ABC):
    """One engine (module docstring): what every engine must do is abstract, the rest has
    a default that engines sharing the launcher's filesystem need not change."""

    name = "base"
    # Whether the job's ranks run on the launcher's machine: they take its process slots
    # (admission) and their native stacks can be read here (evidence).
    ranks_here: ClassVar[bool] = False
    # What a refused submit is called in a job's reason: the engine's own command.
    submit_verb: ClassVar[str] = ""
    # The options a cluster profile of this engine may give, besides the common ones
    # (clusters.COMMON_OPTIONS): name -> engines.Option. Read through the registry.
    profile_options: ClassVar[dict[str, Option]] = {}

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

    @abstractmethod
    def dry_run(self, ctx: AttemptContext) -> DryRun:
        """The engine's native request for the attempt (what `submit` would send)."""

    @abstractmethod
    def submit(self, ctx: AttemptContext, request: DryRun) -> dict[str, Any]:
        """Start the attempt from `request` (this engine's `dry_run(ctx)`); its JSON-able
        handle, or a SubmitError."""

    def adopt(self, ctx: AttemptContext) -> dict[str, Any] | None:
        return None

    @abstractmethod
    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        """The attempt as the engine sees it now."""

    @abstractmethod
    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        """SIGTERM to every rank (the supervisor kills after `grace`)."""

    @abstractmethod
    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        """End every process of the attempt now."""

    def cleanup(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        """Release what an ended job's attempt may still hold; nothing by default."""
        return None  # optional for an engine: nothing to do by default

    def refresh(self) -> None:
        """Called once per supervisor tick before any `describe`."""
        return None  # optional for an engine: nothing to do by default

    def leftover_jobs(self) -> set[str]:
        return set()

    def kill_leftovers(self, job_id: str) -> None:
        """Nothing by default: `kill` and `cleanup` reach everything an attempt holds."""
        return None  # optional for an engine: nothing to do by default

    def release_all(self, is_ours) -> None:
        """Nothing by default."""
        return None  # optional for an engine: nothing to do by default

    def pool_driver(self, options: dict[str, Any] | None) -> PoolDriver | str:
        """The driver of this engine's warm pools for a profile's `options`, or why it holds
        none (the reason jobs start cold, in one line). Declared by `warm_pools`. `options`
        None: the driver of a pool that exists (to watch or release it), whatever the
        profile says now."""
        return f"{self.name} cannot hold a warm pool; jobs start cold"

    def start_standby(self, ctx: AttemptContext) -> None:
        """Warm agents for attempt `ctx.attempt` while the one before it runs; once per
        attempt (a second call does nothing). Where `standby_agents` is declared."""
        raise NotImplementedError(f"{self.name}: no standby agents")

    def standby_started(self, ctx: AttemptContext) -> bool:
        """Whether standby agents were started for this attempt: it starts on them (a warm
        pool would be slower than agents already holding the job's own files)."""
        return False

    def check(self, profile) -> dict[str, Any]:
        return {"ok": True, "detail": "nothing to check"}

    def export_files(self, spec: JobSpec, script: str, files: dict[str, str], job_id: str,
                     exports: list[str]) -> dict[str, str]:
        """The engine's own form of an exported bundle (export.py), relative name -> text:
        what runs the job from the bundle's directory with the engine's own tools and no
        launcher. `files`: the job's pushed files (name -> path); `exports`: the bundle's
        environment lines. None by default."""
        return {}

    def node_host(self, ctx: AttemptContext, handle: dict[str, Any], node: int) -> str | None:
        """The host a node of the attempt runs on, for reasons that name it (None: unknown)."""
        return None

    def logs(self, ctx: AttemptContext, handle: dict[str, Any], rank: int | None = None,
             offset: int = 0, tail: int | None = None,
             limit: int = 2 << 20) -> tuple[list[str], int]:
        """Lines of one rank's log (or node 0's agent log when rank is None) from byte
        `offset`, or its last `tail` lines; returns (lines, next offset). The launcher's logs
        route and the alert rules read every engine's logs here. Each engine brings the logs
        into the attempt directory the launcher holds: a shared filesystem, lines forwarded
        as they are written (SSH's pipe, the report route), or copied from the engine's own
        log store at each describe (Kubernetes' pod logs), so that a log outlives the nodes
        and the engine's retention, and this default reads that copy."""
        from .. import layout

        path = (layout.rank_log(ctx.attempt_dir, rank) if rank is not None
                else layout.node_log(ctx.attempt_dir, 0))
        return layout.read_log(path, offset, tail, limit)


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


def unreachable_launcher(where: str, ctx: AttemptContext) -> str:
    """The reason an attempt ends with when a node's preflight could not deliver its verdict:
    its ranks could not have reported either, so it is not retried."""
    return (f"preflight on {where}: it cannot reach the launcher at {ctx.env.get('DLC_LAUNCHER_URL')}; "
            "serve it on an address the nodes reach (jupyter-dlc launcher start --host ADDR, "
            "or --advertise-url URL)")


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


_engines: dict[str, Engine] = {}
# The URL ranks report to, as the launcher advertises it (set when the launcher starts):
# engines whose ranks run on other hosts refuse a job that could not reach it.
launcher_url: str | None = None


def get_engine(name: str) -> Engine:
    """The one instance of the engine registered as `name` (engines.py: the entry-point group
    `jupyter_dlc.engines`)."""
    if name not in _engines:
        cls = engine_registry.engine_class(name)
        if not (isinstance(cls, type) and issubclass(cls, Engine)):
            raise engine_registry.UnknownEngine(f"engine: the engine {name!r} is no Engine "
                                         "(jupyter_dlc.engines.contract.Engine) subclass")
        _engines[name] = cls()
    return _engines[name]


def refresh_engines() -> None:
    """One snapshot per engine in use, at the start of a supervisor tick."""
    for engine in list(_engines.values()):
        engine.refresh()


def leftover_jobs() -> set[str]:
    """Jobs that some engine in use still holds something of (see `Engine.leftover_jobs`)."""
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
    if spec.engine not in ("local", profile.engine):
        raise SpecError("engine", f"{spec.engine!r} conflicts with cluster {spec.cluster!r} "
                        f"(engine {profile.engine}); drop --engine")
    spec.engine = profile.engine
    return spec


def check_clusters() -> list[dict[str, Any]]:
    """A live check of every profile, like `sky check`: reachable, idle nodes, GPUs."""
    from ..clusters import load_profiles

    rows = []
    for profile in load_profiles().values():
        try:
            result = get_engine(profile.engine).check(profile)
        except Exception as error:  # noqa: BLE001 - one broken profile must not hide the rest
            result = {"ok": False, "detail": f"{type(error).__name__}: {error}"}
        rows.append(dict({"name": profile.name, "engine": profile.engine}, **result))
    return rows
