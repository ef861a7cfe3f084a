"""This machine's processes, as jobs: which belong to which attempt, how many may run, and how
they are started, signalled and killed. Shared by every engine whose processes run here (the
local engine, its pool, the launcher-side end of SSH nodes), the launcher's admission
(`process_slots`) and the local standby agents (node/standby.py). Stdlib only.

Processes are found by the job id in their environment (`/proc/<pid>/environ`), not by
parentage: torchrun starts each worker in a session of its own, and a restarted launcher is
nobody's parent. Where cgroup v2 is writable, every attempt also gets a cgroup of its own (as
Slurm's proctrack/cgroup does): a process cannot leave it by forking twice, starting a
session or clearing its environment, and `cgroup.kill` ends all of it at once, processes
caught mid-fork or mid-exec included. The environment scan stays as the fallback.
"""

from __future__ import annotations

import os
import re
import signal as signals
import time


# Resident memory one CPU rank needs at least (torch imported, a small model): ~400 MB.
_RANK_MEMORY = 400 * 2**20


def available_memory() -> int:
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
    mem_limit = max(1, available_memory() // _RANK_MEMORY) if available_memory() else cpu_limit
    if mem_limit < cpu_limit:
        return mem_limit, f"{_RANK_MEMORY >> 20} MB of free memory each"
    return cpu_limit, "8 per CPU core"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def child(parent: int, marker: bytes) -> int | None:
    """The pid of a live child of `parent` whose command line holds `marker`, if there is one
    (the ingest worker's retention analysis, for benchmarks and tests)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[1]) == parent and marker in command:
            return int(entry)
    return None
