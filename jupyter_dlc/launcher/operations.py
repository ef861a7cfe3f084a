"""What the launcher does for its routes, apart from HTTP: submit (and its dry run), delete,
resume, a job's detail, its logs, metrics, performance and script, and the pools' up and
release. Each takes the launcher (its store and supervisor) and plain arguments, and
answers plain data or raises (SpecError, KeyError, ValueError...), which app.py's
handlers turn into answers; so app.py holds only HTTP (auth, bodies, status codes, streams).
"""

from __future__ import annotations

from typing import Any, Protocol

import base64
import json
import logging
import math
import os
import shutil
import sqlite3

import orjson

from .. import bands
from ..engines.contract import bind_cluster, capability_report, get_engine
from ..spec import JobSpec, SpecError
from ..states import ACTIVE_STATES
from . import branches, checkpoints, dry_run, performance, stragglers
from .storage import is_disk_full
from .answers import _INFINITE, encode
from .store import Store
from .supervisor import Supervisor, create_job_dir, new_job_id

log = logging.getLogger("jupyter_dlc.launcher")

# The longest a delete waits for a stop in flight to end.
STOP_WAIT = 10.0
# The event loop answers every rank's report, so it never waits on an engine: the work of
# an action (a stop's engine call, a delete's process scan, a submit's capacity check such as
# Slurm's sinfo, a pool's allocation) runs on these workers. A stop may wait there for its
# job's start to finish (an sbatch of up to 30 s: supervisor.request_stop).
ACTION_WORKERS = 8
# How long a stop's answer waits for the stop to be recorded (STOPPING, or STOPPED for a job
# that had not started) before it answers 202 with the job as it stands; the stop goes on.
ACTION_WAIT = 1.0


class Launcher(Protocol):
    """What these operations use of the launcher (app.Launcher): its store, its supervisor,
    its data directory and its goodput ledger."""

    store: Store
    supervisor: Supervisor
    data_dir: str
    ledger: Any


class NoSpace(Exception):
    """The data directory's disk is full: nothing new is stored (a 507 with this)."""


class Refused(Exception):
    """An action's work, off the loop, found the request cannot be done: a 400 with this."""



def job_detail(store: Store, row, rank_page: tuple[str, int, int] | None = None) -> dict:
    """A job's detail; with `rank_page` (order, page, size) one page of its ranks, and what
    the rank table's pager shows (`rank_page`)."""
    job = store.summary(row)
    job["spec"] = json.loads(row["spec"])
    if rank_page is None:
        job["ranks"] = [dict(r) for r in store.rank_rows(row["id"], row["attempt"])]
    else:
        order, page, size = rank_page
        rows, page, total, states = store.rank_page(row["id"], row["attempt"], order, page, size)
        job["ranks"] = [dict(r) for r in rows]
        job["rank_page"] = {"sort": order, "page": page, "size": size, "total": total,
                            "pages": max(1, -(-total // size)), "states": states}
    attempts = []
    for a in store.attempt_rows(row["id"]):
        item = {k: a[k] for k in ("attempt", "state", "started", "ended", "reason", "outcome",
                                  "resume_path", "restarts")}
        item["failure"] = json.loads(a["failure"]) if a["failure"] else None
        # The engine's own id for the attempt (a Slurm job id), for views and for humans.
        handle = json.loads(a["handle"] or "{}")
        item["engine_id"] = handle.get("engine_id")
        item["start"] = handle.get("start")  # warm pool or cold start, and why (launcher/pools.py)
        item["checkpoint_dir"] = a["checkpoint_dir"]  # as the engine resolved it at the start
        attempts.append(item)
    job["attempts"] = attempts
    # What the engine cannot do for this job, so that a view says so (a disabled Branch).
    job["engine_report"] = capability_report(JobSpec.from_dict(job["spec"]))
    checkpoints = store.checkpoints(row["id"])
    job["last_checkpoint"] = checkpoints[-1] if checkpoints else None
    # Who the straggler detector names now (launcher/stragglers.py), while the job runs.
    job["stragglers"] = store.alert_summary(row)["stragglers"] if row["state"] in ACTIVE_STATES else []
    return job


def checked_dry_run(launcher: Launcher, spec: JobSpec) -> dict:
    """The engine's native request for the spec, checked as a submit is; nothing stored."""
    check_engine(spec)
    try:
        branch = branches.resolve(launcher.store, launcher.supervisor, spec)
    except SpecError as error:
        raise Refused(str(error)) from None
    if branch is not None:
        spec.branch_from = branch.ref
    return dry_run.native_request(launcher.supervisor, launcher.data_dir, spec)


def checked_submit(launcher: Launcher, spec: JobSpec) -> dict:
    """What the engine says of the spec, then the submit. On an action worker."""
    check_engine(spec)
    return submit(launcher, spec)


def check_engine(spec: JobSpec) -> None:
    """What the engine says of the spec (its capacity check runs sinfo on Slurm, reads the
    cluster profiles): a Refused naming the field, or nothing."""
    try:
        # A cluster profile names the engine; the engine checks what it can run.
        refusal = get_engine(bind_cluster(spec).engine).capacity_error(spec)
    except ValueError as error:  # SpecError, ClusterError, an engine that does not exist
        refusal = str(error)
    if refusal:
        raise Refused(refusal)
    if spec.script is not None and not os.path.isfile(spec.script):
        raise Refused(f"script: {spec.script} does not exist; give a path to a Python file")


def submit(launcher: Launcher, spec: JobSpec) -> dict:
    """Store a new job and copy its files into its directory; off the event loop."""
    job_id = new_job_id(spec.name)
    no_space = NoSpace(f"disk: no space left in {launcher.data_dir}; "
                       "free some, or set DLC_DATA_DIR to a disk with room")
    if launcher.store.storage_problem:
        raise no_space  # the space left is kept for the state of jobs already running
    try:
        branch = branches.resolve(launcher.store, launcher.supervisor, spec)
    except SpecError as error:
        raise Refused(str(error)) from None
    planted = None
    try:
        job_dir = create_job_dir(launcher.data_dir, job_id, spec)
        if branch is not None:
            # Before the job is stored: its first attempt must find the step in place.
            planted = branches.plant(branch, get_engine(spec.engine).checkpoint_dir(spec, job_id, job_dir))
            spec.branch_from = branch.ref
        token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        launcher.store.insert_job(job_id, spec.name, spec.to_dict(), token, job_dir)
    except (SpecError, OSError, sqlite3.OperationalError) as error:
        # Nothing of a job that was not stored stays behind, in its directory or in the
        # user's own --checkpoint-dir (the planted step).
        shutil.rmtree(os.path.join(launcher.data_dir, "jobs", job_id), ignore_errors=True)
        if planted:
            shutil.rmtree(planted, ignore_errors=True)
        if isinstance(error, SpecError):
            raise Refused(str(error)) from None
        if not is_disk_full(error):
            raise
        raise no_space from None
    launcher.supervisor.wake.set()
    return job_detail(launcher.store, launcher.store.job_row(job_id))


def delete_job(launcher: Launcher, row) -> None:
    """The job's rows, whatever of it still runs (the engines' process scan) and its
    directory; on an action worker."""
    launcher.store.delete_job(row["id"])
    launcher.ledger.forget(row["id"])
    launcher.supervisor.forget(row["id"])
    # Only directories the launcher made; a job's own checkpoint_dir elsewhere is the user's.
    if row["job_dir"].startswith(os.path.join(launcher.data_dir, "jobs") + os.sep):
        shutil.rmtree(row["job_dir"], ignore_errors=True)


def resume_job(launcher: Launcher, row, step: int | None) -> None:
    """A new attempt of an ended job, from `step` if given (which must be committed and
    verify: the checkpoint directory is read); on an action worker."""
    supervisor = launcher.supervisor
    if step is not None:
        # The directory the engine resolved for the job's attempts (SSH: the profile's;
        # Kubernetes: the PVC's), not one recomputed here.
        listed = supervisor.checkpoint_steps(row)
        steps = [c["step"] for c in checkpoints.resumable(listed)]
        if step not in steps:
            bad = next((c for c in listed if c["step"] == step), None)
            what = (f"failed verification ({bad['corrupt'][0]['file']}: {bad['corrupt'][0]['why']})"
                    if bad and bad.get("corrupt") else "is not a committed checkpoint")
            raise Refused(f"step: {step!r} {what}; committed steps that verify: "
                          f"{', '.join(map(str, steps)) or 'none'}")
    supervisor.resume(row["id"], step)


def read_logs(supervisor: Supervisor, row, attempt: int, ranks: list[int], offsets: dict,
              tail: int | None) -> dict:
    """A Logs answer: each rank's complete lines from its offset (or its last `tail`)."""
    lines = [{"rank": r, "attempt": attempt, "text": text}
             for r, text in supervisor.logs(row, attempt, ranks, offsets, tail)]
    cursor = base64.urlsafe_b64encode(json.dumps({"attempt": attempt, "offsets": offsets}).encode()).decode()
    return {"lines": lines, "cursor": cursor, "attempt": attempt}


def metrics_answer(store: Store, job_id: str, since: int, keep: frozenset | None = None) -> tuple[bytes, int]:
    """The next page of a job's points after `since` as a Metrics answer, and its last seq.
    With `keep` (a band read, bands.py), train points but those of the ranks in `keep` come
    as band rows."""
    fold = None if keep is None else bands.BandFold(keep)
    points, last = store.metric_page(job_id, since, fold=fold)
    rows = None if fold is None else fold.rows()
    answer = {"points": points, "last_seq": last, "bands": rows,
              "downsampled": downsampled(store.retention_state(job_id))}
    # orjson (ten times json's speed on thousands of points) unless a number is infinite,
    # which orjson would write as null where every answer writes a string (NaN is stored as null)
    if any(point["value"] in _INFINITE for point in points) or \
            any(not math.isfinite(row["sum"]) for row in rows or ()):
        return encode(answer).encode(), last
    return orjson.dumps(answer), last


def downsampled(state: dict | None) -> dict | None:
    """What a view says about older points (retention.py): null while all are as logged."""
    if not state or not state["dropped"]:
        return None
    return {"until": state["downsampled_until"], "bucket_seconds": state["bucket"],
            "dropped": state["dropped"], "keep_last": state["keep_last"]}


def performance_of(store: Store, row) -> dict | None:
    """The performance verdict over the job's newest breakdown points (at most
    performance.READ_POINTS of its points are looked at); on a reader thread."""
    newest = store.newest_metric_seq(row["id"]) or 0
    _, points = store.metric_points(row["id"], max(0, newest - performance.READ_POINTS),
                                    stragglers.BREAKDOWN)
    spec = json.loads(row["spec"])
    nproc = int(spec.get("nproc_per_node") or 1)
    return performance.verdict([(name, t, rank, value) for _seq, name, t, rank, value, _d in points],
                               int(spec.get("nodes") or 1) * nproc, nproc)


def script_of(job_dir: str) -> dict:
    with open(os.path.join(job_dir, "script.py")) as f:
        return {"script": f.read(), "files": sorted(os.listdir(os.path.join(job_dir, "files")))}


def pool_up(pools, body: dict) -> dict:
    try:
        return pools.up(body["nodes"], body["nproc_per_node"], body.get("cluster"), body.get("idle_timeout"))
    except ValueError as error:  # PoolError, an unknown or broken cluster profile
        raise Refused(str(error)) from None


def release_pool(pools, pool_id: str) -> list[str] | None:
    """What was released, or None where no such pool is."""
    if pool_id not in {r["id"] for r in pools.records()}:
        return None
    return pools.release(pool_id)
