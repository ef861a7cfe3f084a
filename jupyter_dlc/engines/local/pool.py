"""The local engine's warm-pool driver: zygotes on this machine (engines/pool_files.py), whose
pids and jobs' processes the launcher sees in /proc and kills itself."""

from __future__ import annotations

import time
from typing import Any

from ... import hostprocs
from .. import pool_files
from ..contract import AttemptContext, PoolDriver


class LocalPoolDriver(PoolDriver):
    """A pool of zygotes on this machine: the launcher starts them, sees their pids and the
    jobs' processes (/proc), and kills what it must."""

    here = True

    def start(self, directory: str, record: dict[str, Any], env: dict[str, str]) -> str | None:
        pool_files.start_agents(directory, record["nodes"], env, record["python"])
        return None

    def broken(self, directory: str, record: dict[str, Any]) -> str | None:
        return "lost an agent" if pool_files.broken(directory, record["nodes"],
                                         record.get("started", record["created"])) else None

    def snapshot(self) -> dict:
        return hostprocs.job_processes()

    def job_left(self, record: dict[str, Any], snapshot: dict, ended: bool) -> bool:
        """Nothing of the last job runs; an ended job's leftovers are killed and given a
        moment to go (pool_files.LEFTOVER_WAIT)."""
        deadline = time.monotonic() + pool_files.LEFTOVER_WAIT
        while True:
            if not snapshot.get((record["job"], record["attempt"])):
                return True
            if not ended:
                return False  # it runs: busy
            hostprocs.kill_job(record["job"], snapshot)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
            snapshot = hostprocs.job_processes()

    def kill_job(self, ctx: AttemptContext) -> None:
        hostprocs.kill_job(ctx.job_id, hostprocs.job_processes())

    def release(self, directory: str, record: dict[str, Any]) -> None:
        pool_files.release(directory)
