"""Warm pools, the launcher's policy: which pools exist, which job may use one, when they go.

One pool per cluster and shape (nodes x processes per node), id `<cluster|local>-<N>x<M>`.
A pool serves one job at a time; a job whose pool is busy (or not ready yet) starts cold at
once rather than wait: a notebook user would rather pay a cold start than sit behind another
cell. The mechanism is `backends/pool.py` (zygotes that fork each job's ranks).

Everything a pool is lives in its directory (`<data_dir>/pools/<id>/pool.json` and the
agents' files), so a launcher started after a crash re-adopts the pools whose agents still
run, and releases the rest. Agents leave by themselves once the launcher stops renewing
their lease (`DLC_POOL_LEASE`, 60 s), so a launcher that never comes back leaves nothing.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import sys
import threading
import time
from typing import Any

from .. import layout
from ..backends import AttemptContext, pool
from ..backends.local import job_processes, kill_job
from ..spec import SpecError, parse_duration
from .store import TERMINAL_STATES, Store

log = logging.getLogger("jupyter_dlc.launcher")

DEFAULT_IDLE_TIMEOUT = float(os.environ.get("DLC_POOL_IDLE_TIMEOUT", "600"))
# How long a job waits for the leftovers of the pool's last (ended) job to be gone.
_LEFTOVER_WAIT = 2.0


class PoolError(ValueError):
    """One line naming the field and the fix."""


def engine_of(cluster: str | None) -> tuple[str, dict]:
    """The engine and profile options a pool on `cluster` would use."""
    if cluster is None:
        return "local", {}
    from ..clusters import get_profile

    profile = get_profile(cluster)
    return profile.engine, dict(profile.options)


def cannot_pool(engine: str, options: dict | None = None) -> str | None:
    """Why an engine holds no warm pool, or None where it can."""
    if engine == "local":
        return None
    if engine == "slurm":
        # The agents take their orders from the pool directory, as ranks their job directory.
        return None if (options or {}).get("shared_filesystem") else \
            "a Slurm pool needs shared_filesystem: true in the profile; jobs start cold"
    if engine == "kubernetes":
        return "kubernetes cannot hold a warm pool (pods start per job); jobs start cold"
    return f"{engine} cannot hold a warm pool; jobs start cold"


class Pools:
    def __init__(self, store: Store, data_dir: str):
        self.store = store
        self.root = os.path.join(data_dir, "pools")
        self.lock = threading.RLock()
        os.makedirs(self.root, exist_ok=True)
        self.readopt()

    # -- records --------------------------------------------------------------------------
    def _dir(self, pid: str) -> str:
        return os.path.join(self.root, pid)

    def _agents_dir(self, record: dict) -> str:
        """Where the pool's agents of this start live (orders, pids, store, logs): a directory
        per start of the pool (`gen-N`), so that agents of a replaced start, still tearing
        down after a scancel (Slurm ends them on its own time, on other hosts), cannot write
        or remove a file of the new start's. Records from before generations use the pool's."""
        generation = record.get("generation")
        return os.path.join(self._dir(record["id"]), f"gen-{generation}") if generation \
            else self._dir(record["id"])

    def _record(self, pid: str) -> dict | None:
        try:
            with open(os.path.join(self._dir(pid), "pool.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _save(self, record: dict) -> None:
        path = os.path.join(self._dir(record["id"]), "pool.json")
        layout.write_json(path, record)

    def records(self) -> list[dict]:
        found = []
        for name in sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []:
            record = self._record(name)
            if record is not None:
                found.append(record)
        return found

    def readopt(self) -> None:
        """At start: keep the pools whose agents are alive (their lease renewed from now on),
        release the ones whose agents died with or after the last launcher."""
        for name in os.listdir(self.root):
            record = self._record(name)
            if record is None:
                for start in glob.glob(os.path.join(self._dir(name), "gen-*")):
                    pool.release(start)
                pool.release(self._dir(name))
            elif not all(pool.agent_pids(self._agents_dir(record), record["nodes"], _here(record))) or \
                    self._broken(record):
                self._release(record)
            else:
                pool.touch_lease(self._agents_dir(record))
                log.info("pool %s re-adopted", name)

    # -- lifecycle ------------------------------------------------------------------------
    def up(self, nodes: int, nproc: int, cluster: str | None = None,
           idle_timeout: float | None = None, auto: bool = False) -> dict:
        if nodes < 1 or nproc < 1:
            raise PoolError("nodes: a pool needs at least 1 node x 1 process; "
                            "use --nodes N --nproc-per-node M with N, M >= 1")
        engine, options = engine_of(cluster)
        refusal = cannot_pool(engine, options)
        if refusal:
            raise PoolError(f"cluster: {cluster}: {refusal}")
        if idle_timeout is None:
            idle_timeout = _duration(options.get("pool_idle_timeout"), DEFAULT_IDLE_TIMEOUT)
        from ..backends.local import process_slots

        pid = pool.pool_id(cluster, nodes, nproc)
        with self.lock:
            record = self._record(pid)
            # Each local agent holds an imported torch (a few hundred MB): all local pools
            # together hold at most as many processes as the machine runs ranks at once.
            held = sum(r["nodes"] * r["nproc_per_node"] for r in self.records()
                       if r["engine"] == "local" and r["id"] != pid)
            if record is None and engine == "local" and held + nodes * nproc > process_slots()[0]:
                raise PoolError(f"nodes x nproc_per_node: {nodes * nproc} more processes with "
                                f"{held} held by other pools exceed what this machine runs at once "
                                f"({process_slots()[0]}); release one (pool down) or ask for fewer")
            if record is not None:
                record["idle_timeout"] = idle_timeout
                self._save(record)
                return self.describe(record)
            record = {"id": pid, "cluster": cluster, "engine": engine, "nodes": nodes,
                      "nproc_per_node": nproc, "python": sys.executable, "created": time.time(),
                      "last_used": time.time(), "idle_timeout": idle_timeout, "seq": 0,
                      "job": None, "attempt": None, "jobs_served": 0, "auto": auto}
            self._start(record)
            return self.describe(record)

    def _start(self, record: dict) -> None:
        record["generation"] = record.get("generation", 0) + 1
        directory = self._agents_dir(record)
        os.makedirs(directory, exist_ok=True)
        record["seq"] = 0  # a new store keeper counts from 1 again
        record["started"] = time.time()
        self._save(record)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLC_")}
        for key in ("DLC_POOL_LEASE",):
            if key in os.environ:
                env[key] = os.environ[key]
        if record["engine"] == "slurm":
            from ..backends import slurm_pool

            env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1",
                       DLC_POOL_DIR=os.path.abspath(directory), DLC_POOL_ROOM=pool.ROOM)
            pool.touch_lease(directory)
            record["engine_id"] = slurm_pool.start_allocation(
                directory, record["cluster"], record["nodes"], record["nproc_per_node"], env)
            self._save(record)
        else:
            pool.start_agents(directory, record["nodes"], env, record["python"])

    def down(self, nodes: int | None = None, nproc: int | None = None,
             cluster: str | None = None, everything: bool = False) -> list[str]:
        """Release the pools that match (all of them when nothing is given)."""
        released = []
        with self.lock:
            for record in self.records():
                if not everything and (
                        (nodes is not None and record["nodes"] != nodes) or
                        (nproc is not None and record["nproc_per_node"] != nproc) or
                        (cluster is not None and record["cluster"] != cluster)):
                    continue
                self._release(record)
                released.append(record["id"])
        return released

    def release(self, pool_id: str) -> list[str]:
        with self.lock:
            record = self._record(pool_id)
            if record is None:
                return []
            self._release(record)
            return [pool_id]

    def _release(self, record: dict) -> None:
        """The pool's processes go, and on Slurm its allocation with them."""
        if record.get("engine_id"):
            from ..backends import slurm_pool

            slurm_pool.cancel(record["cluster"], record["engine_id"])
            # The agents and the store keeper are the allocation's step: scancel ends them
            # wherever they run, in their own time (a replacement starts in a directory of
            # its own meanwhile); the launcher's /proc sees only this machine.
            shutil.rmtree(self._dir(record["id"]), ignore_errors=True)
            return
        pool.release(self._agents_dir(record))
        if record.get("generation"):
            shutil.rmtree(self._dir(record["id"]), ignore_errors=True)

    def _last_job_over(self, record: dict) -> bool:
        """A Slurm pool's last job has left the agents: every node process recorded its exit
        in the shared attempt directory or fell silent (lost, its ranks with it), or the
        allocation that ran them is gone."""
        from ..backends import slurm_pool

        attempt_dir = record.get("attempt_dir")
        if not attempt_dir or not slurm_pool.nodes_left(attempt_dir, record.get("job_nodes", record["nodes"])):
            return True
        return self._broken(record) is not None

    def _ready(self, record: dict) -> bool:
        here = _here(record)
        return pool.ready(self._agents_dir(record), record["nodes"], here) and \
            (here or self._broken(record) is None)

    def _broken(self, record: dict) -> str | None:
        """Why the pool must be replaced, or None. A local pool: an agent or its store keeper
        died. A Slurm pool: its allocation is no longer held (scancel, time limit, a lost
        node, an agent that exited: the step ends with it), as squeue says."""
        directory = self._agents_dir(record)
        if _here(record):
            return "lost an agent" if pool.broken(directory, record["nodes"],
                                                  record.get("started", record["created"])) else None
        from ..backends import slurm_pool

        if not record.get("engine_id"):
            return "holds no allocation"
        state = slurm_pool.polled_state(record["cluster"], record["engine_id"])
        return None if slurm_pool.allocation_held(state) else \
            f"its allocation {record['engine_id']} is {state}"

    def shutdown(self) -> None:
        """A launcher that exits cleanly gives its pools back: they hold memory and nodes."""
        self.down(everything=True)

    def describe(self, record: dict, processes: dict | None = None) -> dict:
        directory = self._agents_dir(record)
        now = time.time()
        busy = self._busy(record, processes)
        state = "busy" if busy else "ready" if self._ready(record) else "starting"
        return {"id": record["id"], "cluster": record["cluster"], "engine": record["engine"],
                "nodes": record["nodes"], "nproc_per_node": record["nproc_per_node"],
                "state": state, "job": record["job"] if busy else None,
                "jobs_served": record["jobs_served"], "created": record["created"],
                "idle_seconds": 0.0 if busy else max(0.0, now - record["last_used"]),
                "idle_timeout": record["idle_timeout"],
                "node_hours": record["nodes"] * (now - record["created"]) / 3600.0,
                "agents": [p for p in pool.agent_pids(directory, record["nodes"], _here(record)) if p],
                "engine_id": record.get("engine_id")}

    def status(self) -> list[dict]:
        processes = self._processes(self.records())
        with self.lock:  # not while a tick replaces a pool (its directory is remade)
            return [self.describe(r, processes) for r in self.records()]

    @staticmethod
    def _processes(records: list[dict]) -> dict:
        """One look at this machine's processes, for the local pools with a job (a Slurm
        pool's jobs are seen through their node processes' files instead)."""
        return job_processes() if any(r.get("job") and _here(r) for r in records) else {}

    def _busy(self, record: dict, processes: dict | None = None) -> bool:
        if not record.get("job"):
            return False
        if not _here(record):
            if not self._last_job_over(record):
                return True
        else:
            processes = job_processes() if processes is None else processes
            if processes.get((record["job"], record["attempt"])):
                return True
        state = self.store.state(record["job"])
        return state is not None and state not in TERMINAL_STATES and \
            self._holds(record["job"], record["attempt"], record["id"])

    def _holds(self, job_id: str, attempt: int, pid: str) -> bool:
        """Whether the job's current attempt was handed to this pool (its handle says)."""
        row = self.store.job_row(job_id)
        if row is None or row["attempt"] != attempt:
            return False
        arow = self.store.attempt_row(job_id, attempt)
        return bool(arow and arow["handle"] and json.loads(arow["handle"]).get("pool") == pid)

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, ctx: AttemptContext) -> tuple[dict[str, Any] | None, str]:
        """Start the attempt on its shape's pool if one is ready and free: the engine handle,
        else None and why it starts cold (shown in the job's reason)."""
        spec = ctx.spec
        if os.path.exists(os.path.join(ctx.attempt_dir, "node-0.go.pid")):
            return None, ""  # a restart with standby agents warmed for it: those are faster
        if spec.cluster is None and spec.backend != "local":
            return None, f"cold start: pools of {spec.backend} need a cluster profile (--cluster NAME)"
        try:
            engine, options = engine_of(spec.cluster)
        except ValueError as error:
            return None, f"cold start ({error})"
        refusal = cannot_pool(engine, options)
        if refusal:
            return None, f"cold start: {refusal}"
        pid = pool.pool_id(spec.cluster, spec.nodes, spec.nproc_per_node)
        with self.lock:
            record = self._record(pid)
            if record is None:
                if options.get("pool"):
                    try:
                        self.up(spec.nodes, spec.nproc_per_node, spec.cluster, auto=True)
                    except PoolError as error:
                        return None, f"cold start ({error})"
                    return None, f"cold start; pool {pid} warming for the next job"
                return None, "cold start (no warm pool for this shape)"
            if (spec.python or sys.executable) != record["python"]:
                return None, f"cold start (pool {pid} runs another Python)"
            directory = self._agents_dir(record)
            if not self._ready(record):
                return None, f"cold start (pool {pid} is still warming)"
            if record.get("job") and not self._free_after_leftovers(record):
                return None, f"cold start (pool {pid} is busy with {record['job']})"
            seq = record["seq"] + 1
            handle = pool.submit(directory, ctx, seq, here=_here(record))
            if handle is None:
                return None, f"cold start (pool {pid} has no store ready yet)"
            if record.get("engine_id"):
                handle["allocation"] = record["engine_id"]
            record.update(seq=seq, job=ctx.job_id, attempt=ctx.attempt, last_used=time.time(),
                          jobs_served=record["jobs_served"] + 1, attempt_dir=ctx.attempt_dir,
                          job_nodes=ctx.spec.nodes)
            self._save(record)
            if handle.pop("broken", False):
                # An agent took no order: the attempt's processes go, the pool is replaced.
                if _here(record):
                    kill_job(ctx.job_id, job_processes())
                else:
                    from ..backends import slurm_pool

                    slurm_pool.order_job(ctx, "KILL")
                self._release(record)
                log.warning("pool %s did not answer; released, the job starts cold", pid)
                return None, f"cold start (pool {pid} did not answer and was replaced)"
            return handle, f"warm pool {pid}"

    def _free_after_leftovers(self, record: dict) -> bool:
        """The pool's last job is over and nothing of it runs (leftovers of an ended job are
        killed, and given a moment to go)."""
        state = self.store.state(record["job"])
        if state is not None and state not in TERMINAL_STATES and \
                self._holds(record["job"], record["attempt"], record["id"]):
            return False
        if not _here(record):
            return self._last_job_over(record)
        deadline = time.monotonic() + _LEFTOVER_WAIT
        while True:
            processes = job_processes()
            if not processes.get((record["job"], record["attempt"])):
                return True
            if state is None or state in TERMINAL_STATES:
                kill_job(record["job"], processes)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    # -- each supervisor tick ---------------------------------------------------------------
    def tick(self, now: float) -> None:
        with self.lock:
            records = self.records()
            # One look at the machine's processes serves every pool with a job this tick.
            processes = self._processes(records)
            for record in records:
                pool.touch_lease(self._agents_dir(record))
                busy = self._busy(record, processes)
                if busy:
                    continue
                broken = self._broken(record)
                if not self._ready(record) and not broken:
                    record["last_used"] = now  # idle time counts from when it is ready
                    self._save(record)
                    continue
                if now - record["last_used"] > record["idle_timeout"]:
                    log.info("pool %s idle for %.0fs: released", record["id"], now - record["last_used"])
                    self._release(record)
                    continue
                if broken:
                    # An agent or the store keeper died (killed, OOM), or a Slurm pool's
                    # allocation ended: replace them all.
                    log.warning("pool %s %s: replacing it", record["id"], broken)
                    self._release(record)
                    record.update(job=None, attempt=None)
                    self._start(record)


def _here(record: dict) -> bool:
    """Whether the pool's agents run on this machine (the launcher may look at their pids)."""
    return record["engine"] == "local"


def _duration(value, default: float) -> float:
    if value is None:
        return default
    try:
        return parse_duration(value, "pool_idle_timeout")
    except (SpecError, ValueError):
        return default
