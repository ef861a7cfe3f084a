"""Warm pools, the launcher's policy: which pools exist, which job may use one, when they go.

One pool per cluster and shape (nodes x processes per node), id `<cluster|local>-<N>x<M>`.
A pool serves one job at a time; a job whose pool is busy (or not ready yet) starts cold at
once rather than wait: a notebook user would rather pay a cold start than sit behind another
cell. The mechanism is `engines/local/pool.py` (zygotes that fork each job's ranks).

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

from .. import engine_registry, layout
from ..engines import pool_files
from ..engines.contract import AttemptContext, PoolDriver, get_engine
from ..spec import SpecError, parse_duration
from .store import TERMINAL_STATES, Store

log = logging.getLogger("jupyter_dlc.launcher")

DEFAULT_IDLE_TIMEOUT = float(os.environ.get("DLC_POOL_IDLE_TIMEOUT", "600"))


class PoolError(ValueError):
    """One line naming the field and the fix."""


def engine_of(cluster: str | None) -> tuple[str, dict]:
    """The engine and profile options a pool on `cluster` would use."""
    if cluster is None:
        return engine_registry.DEFAULT, {}
    from ..clusters import get_profile

    profile = get_profile(cluster)
    return profile.engine, dict(profile.options)


def driver_for(engine: str, options: dict | None = None) -> PoolDriver | str:
    """The engine's pool driver for a profile's options, or why it holds no warm pool."""
    return get_engine(engine).pool_driver(dict(options or {}))


def cannot_pool(engine: str, options: dict | None = None) -> str | None:
    """Why an engine holds no warm pool, or None where it can."""
    driver = driver_for(engine, options)
    return driver if isinstance(driver, str) else None


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
                    pool_files.release(start)
                pool_files.release(self._dir(name))
            elif not all(pool_files.agent_pids(self._agents_dir(record), record["nodes"],
                                               self._driver(record).here)) or self._broken(record):
                self._release(record)
            else:
                pool_files.touch_lease(self._agents_dir(record))
                log.info("pool %s re-adopted", name)

    # -- lifecycle ------------------------------------------------------------------------
    def up(self, nodes: int, nproc: int, cluster: str | None = None,
           idle_timeout: float | None = None, auto: bool = False) -> dict:
        if nodes < 1 or nproc < 1:
            raise PoolError("nodes: a pool needs at least 1 node x 1 process; "
                            "use --nodes N --nproc-per-node M with N, M >= 1")
        engine, options = engine_of(cluster)
        driver = driver_for(engine, options)
        if isinstance(driver, str):
            raise PoolError(f"cluster: {cluster}: {driver}")
        if idle_timeout is None:
            idle_timeout = _duration(options.get("pool_idle_timeout"), DEFAULT_IDLE_TIMEOUT)
        from ..hostprocs import process_slots

        pid = pool_files.pool_id(cluster, nodes, nproc)
        with self.lock:
            record = self._record(pid)
            # Each agent on this machine holds an imported torch (a few hundred MB): all such
            # pools together hold at most as many processes as the machine runs ranks at once.
            held = sum(r["nodes"] * r["nproc_per_node"] for r in self.records()
                       if self._driver(r).here and r["id"] != pid)
            if record is None and driver.here and held + nodes * nproc > process_slots()[0]:
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

    def _driver(self, record: dict) -> PoolDriver:
        """The pool's engine driver (whatever its profile says now: the pool exists)."""
        driver = get_engine(record["engine"]).pool_driver(None)
        assert not isinstance(driver, str), driver  # a pool was started, so it has one
        return driver

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
        record["engine_id"] = self._driver(record).start(directory, record, env)
        self._save(record)

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
        """The pool's agents go (and what holds them: a Slurm allocation), with its directory."""
        self._driver(record).release(self._agents_dir(record), record)
        shutil.rmtree(self._dir(record["id"]), ignore_errors=True)

    def _ready(self, record: dict) -> bool:
        driver = self._driver(record)
        return pool_files.ready(self._agents_dir(record), record["nodes"], driver.here) and \
            (driver.here or self._broken(record) is None)

    def _broken(self, record: dict) -> str | None:
        """Why the pool must be replaced, or None (its driver says: an agent or its store
        keeper died; a Slurm allocation no longer held)."""
        return self._driver(record).broken(self._agents_dir(record), record)

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
                "agents": [p for p in pool_files.agent_pids(directory, record["nodes"],
                                                            self._driver(record).here) if p],
                "engine_id": record.get("engine_id")}

    def status(self) -> list[dict]:
        processes = self._processes(self.records())
        with self.lock:  # not while a tick replaces a pool (its directory is remade)
            return [self.describe(r, processes) for r in self.records()]

    def _processes(self, records: list[dict]) -> dict:
        """One look at what runs, per driver with a pool that has a job, shared by its pools
        this tick (the local driver's /proc scan; nothing for a Slurm pool, whose jobs are
        seen through their node processes' files)."""
        looks: dict[type, dict] = {}
        for record in records:
            driver = self._driver(record)
            if record.get("job") and type(driver) not in looks:
                looks[type(driver)] = driver.snapshot()
        return looks

    def _busy(self, record: dict, processes: dict | None = None) -> bool:
        if not record.get("job"):
            return False
        driver = self._driver(record)
        snapshot = (processes or {}).get(type(driver))
        if not driver.job_left(record, driver.snapshot() if snapshot is None else snapshot, ended=False):
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
        if get_engine(spec.engine).standby_started(ctx):
            return None, ""  # a restart with standby agents warmed for it: those are faster
        if spec.cluster is None and spec.engine != engine_registry.DEFAULT:
            return None, f"cold start: pools of {spec.engine} need a cluster profile (--cluster NAME)"
        try:
            engine, options = engine_of(spec.cluster)
        except ValueError as error:
            return None, f"cold start ({error})"
        refusal = cannot_pool(engine, options)
        if refusal:
            return None, f"cold start: {refusal}"
        pid = pool_files.pool_id(spec.cluster, spec.nodes, spec.nproc_per_node)
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
            driver = self._driver(record)
            handle = pool_files.submit(directory, ctx, seq, here=driver.here)
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
                driver.kill_job(ctx)
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
        driver = self._driver(record)
        return driver.job_left(record, driver.snapshot(), ended=state is None or state in TERMINAL_STATES)

    # -- each supervisor tick ---------------------------------------------------------------
    def tick(self, now: float) -> None:
        with self.lock:
            records = self.records()
            # One look at the machine's processes serves every pool with a job this tick.
            processes = self._processes(records)
            for record in records:
                pool_files.touch_lease(self._agents_dir(record))
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


def _duration(value, default: float) -> float:
    if value is None:
        return default
    try:
        return parse_duration(value, "pool_idle_timeout")
    except (SpecError, ValueError):
        return default
