"""Write one rank's part of a checkpoint step, and commit the step once every rank has.

Runs on the Checkpointer's background thread. The commit needs to know that all ranks of the
world wrote their file, but a collective here would need every rank's training thread to
join it. Instead each rank drops a sidecar `{"size", "sha256", "token"}` after its file is
durable, and rank 0 polls the step directory for all of them before writing the manifest.
This relies on every node seeing the same checkpoint directory (a shared file system), which
is how jobs are run: the launcher reads the same directory to pick DLC_RESUME_PATH.

`token` names this run's save round (shared by all ranks through the job store), so sidecars
left in the same step directory by an earlier run never count for this one.
"""

import hashlib
import json
import os
import shutil
import time

import torch

from .. import layout

POLL_SECONDS = 0.05


class PersistError(RuntimeError):
    pass


class _HashingWriter:
    """A file that hashes what passes through it, so the sha256 costs no second read.

    Keeps the OSError of a failed write: torch.save reports it only as an "unexpected pos"
    enforce failure, which would hide the cause (a full disk, say) from the report."""

    def __init__(self, f):
        self.f = f
        self.digest = hashlib.sha256()
        self.size = 0
        self.error = None

    def write(self, data):
        try:
            written = self.f.write(data)
        except OSError as error:
            self.error = error
            raise
        self.digest.update(data)
        self.size += len(data)
        return written

    def flush(self):
        self.f.flush()


def write_rank_file(step_path, rank, token, state):
    """Serialise this rank's state into the step directory; returns its byte size."""
    os.makedirs(step_path, exist_ok=True)
    # A step saved again (a resume from an older step) must stop counting before any of
    # its files change.
    _remove_quietly(os.path.join(step_path, layout.MANIFEST))
    final = os.path.join(step_path, layout.rank_file_name(rank))
    tmp = os.path.join(step_path, f".{layout.rank_file_name(rank)}.tmp")
    try:
        with open(tmp, "wb") as f:
            writer = _HashingWriter(f)
            try:
                torch.save(state, writer)
            except RuntimeError:
                if writer.error is not None:
                    raise writer.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        layout.write_json_atomic(
            os.path.join(step_path, layout.rank_sidecar_name(rank)),
            {"size": writer.size, "sha256": writer.digest.hexdigest(), "token": token})
    except BaseException:
        _remove_quietly(tmp)
        _mark_failed(step_path, rank, token)
        raise
    return writer.size


def commit(step_path, step, world_size, token, timeout, replicated=False):
    """Rank 0: wait for every rank's sidecar, then write the manifest. Returns the total
    size. Raises PersistError when a rank failed or never finished."""
    deadline = time.monotonic() + timeout
    while True:
        sidecars, failed = _read_round(step_path, world_size, token)
        if failed:
            abandon(step_path, world_size, token, deadline - time.monotonic())
            raise PersistError(f"ranks {sorted(failed)} failed to write step {step}")
        if len(sidecars) == world_size:
            break
        if time.monotonic() > deadline:
            missing = sorted(set(range(world_size)) - set(sidecars))
            raise PersistError(f"step {step}: ranks {missing} did not write their part "
                               f"within {timeout:.0f}s")
        time.sleep(POLL_SECONDS)
    files = {}
    for rank, sidecar in sidecars.items():
        name = layout.rank_file_name(rank)
        if os.path.getsize(os.path.join(step_path, name)) != sidecar["size"]:
            raise PersistError(f"step {step}: {name} does not have the size its rank wrote")
        files[name] = {"size": sidecar["size"], "sha256": sidecar["sha256"]}
    layout.write_manifest(step_path, step, world_size, files, replicated)
    return sum(record["size"] for record in files.values())


def abandon(step_path, world_size, token, timeout):
    """Rank 0, after a failed round: once every rank is done writing, remove the step
    directory. That frees the space a full disk needs for the next save."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sidecars, failed = _read_round(step_path, world_size, token)
        if len(sidecars) + len(failed) == world_size:
            break
        time.sleep(POLL_SECONDS)
    _remove_step(step_path)


def wait_for_commit(step_path, step, world_size, token, timeout):
    """Other ranks: wait until rank 0 committed the step, or the round failed."""
    deadline = time.monotonic() + timeout
    while not layout.verify_step(step_path):
        _, failed = _read_round(step_path, world_size, token)
        if failed or not os.path.isdir(step_path):
            raise PersistError(f"step {step} was not committed: ranks {sorted(failed)} failed")
        if time.monotonic() > deadline:
            raise PersistError(f"step {step} was not committed within {timeout:.0f}s")
        time.sleep(POLL_SECONDS)


def prune(ckpt_dir, keep_last, newest_step):
    """Keep the newest keep_last committed steps; drop older ones and older leftovers of
    failed saves. Called only after newest_step committed, so a committed step always
    remains."""
    committed = [record["step"] for record in layout.committed_steps(ckpt_dir)]
    keep = set(committed[-keep_last:])
    for step, path in layout.step_dirs(ckpt_dir).items():
        if step < newest_step and step not in keep:
            _remove_step(path)


def _read_round(step_path, world_size, token):
    """({rank: sidecar} of this round's finished ranks, {ranks that failed this round})."""
    sidecars, failed = {}, set()
    for rank in range(world_size):
        if os.path.exists(os.path.join(step_path, layout.rank_failure_name(rank, token))):
            failed.add(rank)
            continue
        try:
            with open(os.path.join(step_path, layout.rank_sidecar_name(rank))) as f:
                sidecar = json.load(f)
        except (OSError, ValueError):
            continue
        if sidecar.get("token") == token:
            sidecars[rank] = sidecar
    return sidecars, failed


def _mark_failed(step_path, rank, token):
    # An empty file: creating it needs no data blocks, so it works on a full disk.
    try:
        open(os.path.join(step_path, layout.rank_failure_name(rank, token)), "w").close()
    except OSError:
        pass  # rank 0 then gives up at its timeout instead


def _remove_step(path):
    # Manifest first, so a half-removed step never looks committed.
    _remove_quietly(os.path.join(path, layout.MANIFEST))
    shutil.rmtree(path, ignore_errors=True)


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
