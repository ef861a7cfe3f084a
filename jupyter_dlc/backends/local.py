"""Local engine: one torchrun agent per simulated node, all on this machine.

Processes are found by the job id in their environment (`/proc/<pid>/environ`), not by
parentage: torchrun starts each worker in a session of its own, and a restarted launcher is
nobody's parent. So `signal` reaches every process of an attempt whoever started it, and
nothing is left behind.

Where cgroup v2 is writable, every attempt also gets a cgroup of its own (as Slurm's
proctrack/cgroup does): a process cannot leave it by forking twice, starting a session or
clearing its environment, and `cgroup.kill` ends all of it at once, processes caught
mid-fork or mid-exec included. The environment scan stays as the fallback.
"""

from __future__ import annotations

import os
import re
import signal as signals
import subprocess
import sys
import time
from typing import Any

from .. import layout, node_reporter, shell
from ..shims import torch_private
from ..spec import JobSpec
from . import (
    AttemptContext,
    AttemptStatus,
    Backend,
    Capabilities,
    NodeStatus,
    Phase,
    RankStatus,
    children,
)

# Exit code recorded for a rank that vanished without one: 128 + SIGKILL, the usual cause.
KILLED = 137
VANISHED_GRACE = 1.0  # seconds; torchrun's own verdict usually comes within 0.2 s
_vanished: dict[tuple[str, int, int], float] = {}
# Resident memory one CPU rank needs at least (torch imported, a small model): ~400 MB.
_RANK_MEMORY = 400 * 2**20
_SUMMARY_TAIL = 64 * 1024
_SUMMARY_BLOCK = torch_private.SUMMARY_RANK_EXIT


def torchrun_argv(spec: JobSpec, node: int | str, port: int | str, script: str, python: str,
                  master_addr: str = "127.0.0.1") -> list[str]:
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}", f"--node-rank={node}", f"--nproc-per-node={spec.nproc_per_node}",
        f"--master-addr={master_addr}", f"--master-port={port}",
        # The launcher owns restarts (whole-job, resumed from a committed checkpoint).
        "--max-restarts=0", "--monitor-interval=0.1",
        "-m", "jupyter_dlc.runtime.bootstrap", script, *spec.args,
    ]


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def visible_gpus() -> int:
    """GPUs this machine shows, without importing torch (NVML through the driver files)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return len([name for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name)]) \
        if os.path.isdir("/dev") else 0


# The umask a job's processes run with: the one the launcher was started with (the launcher
# itself runs with 077), so that a job's own outputs get the modes its user expects.
CHILD_UMASK = -1
_CGROUP_DIR = "jupyter-dlc"
_cgroup_base: str | None | bool = False  # False: not looked for yet; None: not usable here


def cgroup_base() -> str | None:
    """The directory under which attempts get their cgroups, or None where cgroup v2 is not
    mounted or not writable by us (then only the environment scan finds processes)."""
    global _cgroup_base
    if _cgroup_base is not False:
        return _cgroup_base if isinstance(_cgroup_base, str) else None
    _cgroup_base = None
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]
        with open("/proc/self/cgroup") as f:
            own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if not mounts or own is None:
        return None
    # A process of a job (a standby agent scanning for its attempt) sits in an attempt's
    # cgroup: the base is the one above it, never a new one nested inside.
    own = ("/" + own.strip("/") + "/").split(f"/{_CGROUP_DIR}/")[0].rstrip("/")
    base = os.path.join(mounts[0] + own, _CGROUP_DIR)
    try:
        os.makedirs(base, exist_ok=True)
        probe = os.path.join(base, f"probe-{os.getpid()}")
        os.makedirs(probe, exist_ok=True)
        usable = os.path.exists(os.path.join(probe, "cgroup.procs"))
        os.rmdir(probe)
    except OSError:
        return None
    _cgroup_base = base if usable else None
    return _cgroup_base


def attempt_cgroup(job_id: str, attempt: int, create: bool = False) -> str | None:
    base = cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, f"{job_id}.{attempt}")
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
    return path if os.path.isdir(path) else None


# An attempt's cgroup found empty this long after it was made is removed by whichever
# launcher scans it: one killed with -9 never released its jobs', and every later scan (each
# supervisor tick, of every launcher on the machine) read them all. An attempt's processes
# join its cgroup as they start, within seconds of its making; the kernel refuses to remove
# one that holds a process.
STALE_CGROUP_S = 60.0


def _cgroup_members() -> dict[tuple[str, int], set[int]]:
    base = cgroup_base()
    found: dict[tuple[str, int], set[int]] = {}
    if base is None:
        return found
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        job, _, attempt = name.rpartition(".")
        if not job or not attempt.isdigit():
            continue
        path = os.path.join(base, name)
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = {int(line) for line in f if line.strip()}
            if not pids and time.time() - os.stat(path).st_mtime > STALE_CGROUP_S:
                os.rmdir(path)
        except (OSError, ValueError):
            continue
        if pids:
            found[(job, int(attempt))] = pids
    return found


def cgroup_jobs() -> set[str]:
    """Jobs that have a cgroup here, empty or not."""
    base = cgroup_base()
    try:
        return {name.rpartition(".")[0] for name in os.listdir(base)} - {""} if base else set()
    except OSError:
        return set()


# How long kill_leftovers waits for SIGKILLed processes to be gone.
LEFTOVER_WAIT = 5.0


def kill_job(job_id: str, processes: dict[tuple[str, int], list[int]]) -> None:
    """SIGKILL every process of every attempt of the job (cgroups first, then the scan)."""
    base = cgroup_base() or ""
    for name in (os.listdir(base) if base and os.path.isdir(base) else []):
        if name.rpartition(".")[0] == job_id:
            try:
                with open(os.path.join(base, name, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass
    for (job, _), pids in processes.items():
        if job == job_id:
            for pid in pids:
                try:
                    os.kill(pid, signals.SIGKILL)
                except ProcessLookupError:
                    pass


def release_cgroups(job_id: str) -> None:
    """Remove the job's (empty) cgroups; one that still holds a process stays."""
    base = cgroup_base()
    if base is None:
        return
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if name.rpartition(".")[0] == job_id:
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass


def job_processes() -> dict[tuple[str, int], list[int]]:
    """(job id, attempt) → pids, for every process on this machine that belongs to a job:
    by cgroup where there is one, and by the job id in the environment."""
    found: dict[tuple[str, int], list[int]] = {}
    for key, members in _cgroup_members().items():
        found[key] = sorted(members)
    own = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z" or b"DLC_JOB_ID=" not in environ:
            continue
        if environ.startswith(b"DLC_EXPORTED=1\0") or b"\0DLC_EXPORTED=1\0" in environ:
            continue  # an exported bundle's run (export.py): carries a job's id, is not its
        job = attempt = None
        for item in environ.split(b"\0"):
            if item.startswith(b"DLC_JOB_ID="):
                job = item[11:].decode()
            elif item.startswith(b"DLC_ATTEMPT="):
                attempt = int(item[12:] or 0)
        # A job id is never empty: DLC_JOB_ID="" (a user's shell, a test) names no job, and
        # would make jobs/"" the jobs directory itself.
        if job and attempt is not None:
            pids = found.setdefault((job, attempt), [])
            if int(entry) not in pids:
                pids.append(int(entry))
    return found


def process_slots() -> tuple[int, str]:
    """How many ranks this machine runs at once, and why: $DLC_PROCESS_SLOTS, else 8 per
    CPU core, or fewer where free memory holds fewer."""
    configured = os.environ.get("DLC_PROCESS_SLOTS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured), "DLC_PROCESS_SLOTS"
    cpu_limit = 8 * (os.cpu_count() or 1)
    mem_limit = max(1, _available_memory() // _RANK_MEMORY) if _available_memory() else cpu_limit
    if mem_limit < cpu_limit:
        return mem_limit, f"{_RANK_MEMORY >> 20} MB of free memory each"
    return cpu_limit, "8 per CPU core"


def agent_summary_codes(attempt_dir: str, nodes: int) -> dict[int, int]:
    """Exit codes of workers killed by a signal, from torchrun's failure summary in each
    node's log (every engine whose node logs reach the job directory reads them so)."""
    codes: dict[int, int] = {}
    for node in range(nodes):
        try:
            with open(layout.node_log(attempt_dir, node), "rb") as f:
                # The summary is what an agent prints last; this runs every tick.
                f.seek(max(0, os.fstat(f.fileno()).st_size - _SUMMARY_TAIL))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        for rank, code in _SUMMARY_BLOCK.findall(text):
            code = int(code)
            # torchrun reports death by signal N as -N; the shell convention is 128 + N.
            codes[int(rank)] = 128 - code if code < 0 else code
    return codes


class LocalBackend(Backend):
    name = "local"

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
                    f"({limit}: {why}); ask for fewer, or use a cluster backend")
        return None

    def dry_run(self, ctx: AttemptContext) -> dict[str, Any]:
        python = ctx.spec.python or sys.executable
        commands = [torchrun_argv(ctx.spec, node, ctx.port, ctx.script_path, python)
                    for node in range(ctx.spec.nodes)]
        return {"backend": "local", "cwd": ctx.spec.workdir or ctx.job_dir, "env": ctx.env,
                "commands": commands,
                "shell": [shell.command(argv) for argv in commands]}

    def start_standby(self, ctx: AttemptContext) -> None:
        """Warm agents for attempt `ctx.attempt`, started while the attempt before it runs
        (once: not while processes of that attempt exist, nor after they died or were used)."""
        if (self.snapshot or {}).get((ctx.job_id, ctx.attempt)) or self.standby_started(ctx):
            return
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        python = ctx.spec.python or sys.executable
        for node in range(ctx.spec.nodes):
            pid = _spawn(ctx, node, [python, "-m", "jupyter_dlc.backends.standby",
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
            if pid is None or not _alive(pid):
                return None
            pids.append(pid)
        return pids

    def start(self, ctx: AttemptContext) -> dict[str, Any]:
        request = self.dry_run(ctx)
        standbys = self._standbys(ctx)
        if standbys:
            for node, argv in enumerate(request["commands"]):
                # argv[3:] drops `python -m torch.distributed.run`; the standby is that. The
                # env holds the attempt's token.
                layout.write_json(_go_file(ctx, node), {"args": argv[3:], "env": dict(
                    ctx.env, DLC_NODE_RANK=str(node))}, mode=0o600)
            return {"nodes": [{"node": n, "pid": pid} for n, pid in enumerate(standbys)],
                    "standby": True}
        nodes = []
        for node, argv in enumerate(request["commands"]):
            exit_path = layout.node_exit(ctx.attempt_dir, node)
            # The shell outlives torchrun only to record its exit code, which a launcher that
            # restarted meanwhile could not learn from waitpid.
            wrapper = f'{shell.command(argv)}; echo $? > {shell.quote(exit_path)}'
            if node_reporter.wanted(ctx.spec.nproc_per_node):
                # The node's ranks report through one node reporter, which leaves with this shell.
                wrapper = node_reporter.shell_start(
                    shell.quote(argv[0]),
                    shell.quote(node_reporter.url_file(ctx.attempt_dir, node))) + wrapper
            nodes.append({"node": node, "pid": _spawn(ctx, node, ["/bin/sh", "-c", wrapper])})
        return {"nodes": nodes}

    def poll(self, ctx: AttemptContext, handle: dict[str, Any],
             processes: dict[tuple[str, int], list[int]] | None = None) -> AttemptStatus:
        if processes is None:
            processes = job_processes()
        alive = set(processes.get((ctx.job_id, ctx.attempt), []))
        status = AttemptStatus()
        for node in range(ctx.spec.nodes):
            exit_code = layout.read_int(layout.node_exit(ctx.attempt_dir, node))
            pid = next((n["pid"] for n in handle.get("nodes", []) if n["node"] == node), None)
            running = exit_code is None and pid is not None and pid in alive
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
            running = exit_code is None and pid is not None and pid in alive
            if exit_code is None and pid is not None and not running and not _alive(pid):
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

    # -- the engine contract over the methods above (see backends/__init__.py) -------------
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

    def submit(self, ctx: AttemptContext) -> dict[str, Any]:
        return self.start(ctx)

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
                "detail": f"this machine: {os.cpu_count()} CPUs, {_available_memory() >> 30} GB free"}


def _spawn(ctx: AttemptContext, node: int, argv: list[str]) -> int:
    """Start one node's process in a session of its own (it must outlive the launcher),
    its output appended to the node's log; returns its pid."""
    cgroup = attempt_cgroup(ctx.job_id, ctx.attempt, create=True)
    if cgroup:
        # The process joins the attempt's cgroup before it runs anything; what it starts is
        # born inside. (A shell, not preexec_fn: the launcher has threads.)
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" 2>/dev/null; exec "$@"',
                os.path.join(cgroup, "cgroup.procs"), *argv]
    with open(layout.node_log(ctx.attempt_dir, node), "ab") as log:
        proc = subprocess.Popen(argv, cwd=ctx.spec.workdir or ctx.job_dir,
                                env=dict(ctx.env, DLC_NODE_RANK=str(node)),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, umask=CHILD_UMASK)
    return children.detach(proc)  # reaped by the supervisor's tick (children.py)


def _ranks_with_errors(ctx: AttemptContext) -> set[int]:
    """Ranks of the attempt whose bootstrap recorded an exception (`rank-R.error.json`)."""
    return {rank for rank in range(ctx.spec.world_size)
            if os.path.exists(layout.rank_error_json(ctx.attempt_dir, rank))}


def _go_file(ctx: AttemptContext, node: int) -> str:
    return os.path.join(ctx.attempt_dir, f"node-{node}.go")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False




TERM, KILL = signals.SIGTERM, signals.SIGKILL
