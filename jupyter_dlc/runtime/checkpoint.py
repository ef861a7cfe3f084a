"""Checkpointer: save with one short stall, persist in the background, restore on resume.

A save copies state into host buffers on the calling thread (staging.py), then a background
thread serialises this rank's file and, on rank 0, commits the step once every rank wrote
its part (persist.py); once committed, each rank copies its file to the node's shared
memory (node_copy.py), which a restart on this node restores from. At most one persist is
in flight: the host buffers are reused, so a save that finds one still running waits for
it first.
"""

import atexit
import io
import os
import sys
import threading
import time
import uuid

import torch
import torch.distributed as dist

from .. import layout
from . import breakdown, control, ddp_layout, node_copy, persist, restore_state, rng, sharded_state
from .dist_init import job_store
from .env import rank_info
from .report import get_reporter
from .staging import HostStaging

PERSIST_NICENESS = 10
_round_token = None


EXIT_WAIT_CLEAN = 300.0
EXIT_WAIT_FAILED = 2.0
# How long a rank that found its file corrupt tries to tell the launcher before it fails.
CORRUPT_REPORT_WAIT = 10.0
_dying = False


def _note_uncaught_exceptions():
    previous = sys.excepthook
    if getattr(previous, "_dlc", False):
        return

    def hook(kind, value, tb):
        global _dying
        _dying = True
        previous(kind, value, tb)

    hook._dlc = True
    sys.excepthook = hook


class Checkpointer:
    """Checkpointer(model=..., optimizer=..., **more_state): every object with
    state_dict()/load_state_dict() (lr scheduler, ResumableDistributedSampler, ...).

    checkpoint_dir: default DLC_CHECKPOINT_DIR, else <DLC_JOB_DIR>/checkpoints, else
    ./checkpoints. keep_last: committed steps to keep, default DLC_KEEP_LAST.
    The last Checkpointer built is the one a stop or "checkpoint" command saves with.
    """

    def __init__(self, model=None, optimizer=None, *, checkpoint_dir=None, keep_last=None,
                 **more_state):
        info = rank_info()
        self.objects = {name: obj for name, obj in
                        {"model": model, "optimizer": optimizer, **more_state}.items()
                        if obj is not None}
        self.checkpoint_dir = os.path.abspath(
            checkpoint_dir or info.checkpoint_dir
            or (layout.default_checkpoint_dir(info.job_dir) if info.job_dir else "checkpoints"))
        self.keep_last = info.keep_last if keep_last is None else keep_last
        self.timeout = info.collective_timeout
        self.last_committed_step = None
        self.last_error = None
        self.restored_from = None  # "shared memory" or "disk" after a restore
        self._staging = HostStaging()
        self._thread = None
        self._last_saved_step = None
        self._ddps = None  # name -> DDP wrapper, found at the first save or restore
        control.register_checkpointer(self)
        atexit.register(self._wait_at_exit)
        _note_uncaught_exceptions()

    def _wait_at_exit(self):
        """Let the last save commit on a clean exit; dying of an exception, peers may be gone
        and a commit waiting for their files would hang this rank and so the whole job."""
        if self._thread is not None:
            self._thread.join(EXIT_WAIT_FAILED if _dying else EXIT_WAIT_CLEAN)

    def save(self, step):
        """Stage state now (the only stall) and persist it in the background.

        `step` is the number of optimizer steps completed. A second save of the same step is
        a no-op. Refused (with a message) once a logged value went NaN/Inf, so the last good
        checkpoint stays the newest.
        """
        if control.non_finite():
            print(f"jupyter_dlc: checkpoint at step {step} refused: {control.non_finite()}",
                  file=sys.stderr, flush=True)
            return
        if step == self._last_saved_step:
            return
        with breakdown.checkpoint_stall():  # the step's ckpt_stall_ms
            self._stage(step)

    def _stage(self, step):
        self.wait()
        started = time.monotonic()
        # FSDP2's DTensors are saved as this rank's local shards (sharded_state.py).
        live = {name: obj.state_dict() for name, obj in self.objects.items()}
        # DDP and no shards: every rank holds the same model and optimizer (a branch may
        # restore the step with another number of ranks).
        replicated = bool(self._ddp_objects()) and not sharded_state.holds_shards(live)
        state = {name: sharded_state.localize(value) for name, value in live.items()}
        state["rng"] = rng.capture()
        state["step"] = step
        layouts = ddp_layout.capture(self._ddp_objects())
        if layouts:
            state[ddp_layout.STATE_KEY] = layouts
        staged, ready = self._staging.stage(state)
        self._last_saved_step = step
        self._thread = threading.Thread(
            target=self._persist, args=(staged, ready, step, started, _shared_round_token(), replicated),
            name=f"dlc-checkpoint-{step}", daemon=True)
        self._thread.start()

    def wait(self):
        """Block until the save in flight, if any, committed or failed. Returns True when
        the last save committed."""
        if self._thread is not None:
            with breakdown.checkpoint_stall():
                self._thread.join()
        return self._last_saved_step is not None and \
            self.last_committed_step == self._last_saved_step

    def restore(self, strict=True):
        """Load DLC_RESUME_PATH (else the newest committed step in checkpoint_dir) into the
        objects and RNGs; returns the step to continue from, 0 when there is none.

        A model that no longer fits the checkpoint (edited code) raises CheckpointMismatch,
        which lists the missing, unexpected and reshaped keys; with strict=False what matches
        is restored and the rest keeps the code's initial values (restore_state.py).
        A branch's step (`--from`) keeps the code's optimizer settings (its learning rate)."""
        info = rank_info()
        path = info.resume_path
        if not path:
            latest = layout.latest_committed(self.checkpoint_dir)
            if latest is None:
                return 0
            path = latest["path"]
        if not layout.verify_step(path):
            raise RuntimeError(f"resume path {path} is not a committed checkpoint step "
                               "(no manifest, or files missing or truncated)")
        rank, world_size = _rank_and_world()
        manifest = layout.read_manifest(path)
        saved_world = manifest["world_size"]
        regrown = saved_world != world_size
        if regrown and not manifest.get("replicated"):
            raise RuntimeError(f"resume path {path} was saved by {saved_world} ranks, this run has "
                               f"{world_size}; only a DDP job's step (the same state on every rank) "
                               "can be restored by another number of ranks")
        # Another world size (a branch of a DDP job): each rank takes a replica's file, and
        # a ResumableDistributedSampler carries the epoch's global position over.
        state = self._load_rank_file(path, rank % saved_world, manifest)
        # The branch's own step, restored by its first attempt (or by a restart before its
        # first save): the code running may differ from the code that saved it.
        branch = info.branch_from if info.branch_step == state["step"] else ""
        changed = restore_state.load(self.objects, state, path, strict=strict, branch=branch,
                                     fresh_optimizer=info.fresh_optimizer)
        rng.restore(state["rng"])
        # DDP's saved bucket layout is of the saved parameters and world: a changed model, or
        # another world size, builds its own.
        if not changed and not regrown:
            ddp_layout.restore(self._ddp_objects(), state.get(ddp_layout.STATE_KEY), rank)
        self._last_saved_step = self.last_committed_step = state["step"]
        return state["step"]

    def _load_rank_file(self, path, rank, manifest):
        """This rank's state of step `path`: from the node's shared-memory copy when it is
        that committed file (node_copy.py), else from the checkpoint directory once the file
        hashes to the manifest's sha256 (each rank checks its own file: in parallel, and on
        every engine, whether or not the launcher sees the checkpoint directory)."""
        job_dir = rank_info().job_dir
        if job_dir:
            content, why = node_copy.load(job_dir, rank, path)
            if content is not None:
                self.restored_from = "shared memory"
                print(f"jupyter_dlc: restoring {os.path.basename(path)} from this node's "
                      "shared-memory copy", file=sys.stderr, flush=True)
                return torch.load(io.BytesIO(content), map_location="cpu", weights_only=False)
            print(f"jupyter_dlc: restoring {os.path.basename(path)} from disk: {why}",
                  file=sys.stderr, flush=True)
        name = layout.rank_file_name(rank)
        started = time.monotonic()
        why = layout.file_mismatch(path, name, manifest["files"].get(name), deep=True)
        if why is not None:
            _refuse_corrupt(path, rank, name, why, manifest)
        print(f"jupyter_dlc: {os.path.basename(path)}/{name} matches its manifest's sha256 "
              f"(checked in {time.monotonic() - started:.3f}s)", file=sys.stderr, flush=True)
        self.restored_from = "disk"
        return torch.load(os.path.join(path, name), map_location="cpu", weights_only=False)

    def _ddp_objects(self):
        if self._ddps is None:
            found = {name: ddp_layout.find_ddp(obj) for name, obj in self.objects.items()}
            self._ddps = {name: ddp for name, ddp in found.items() if ddp is not None}
        return self._ddps

    def _persist(self, staged, ready, step, started, token, replicated=False):
        rank, world_size = _rank_and_world()
        step_path = layout.step_dir(self.checkpoint_dir, step)
        reporter = get_reporter()
        _yield_cpu_to_training()
        try:
            if ready is not None:
                ready.synchronize()
            try:
                persist.write_rank_file(step_path, rank, token, staged)
            except OSError:
                if rank == 0:
                    persist.abandon(step_path, world_size, token, self.timeout)
                raise
            if rank == 0:
                size = persist.commit(step_path, step, world_size, token, self.timeout, replicated)
                persist.prune(self.checkpoint_dir, self.keep_last, step)
                if reporter:
                    reporter.event("checkpoint", step=step, path=step_path, size=size,
                                   seconds=round(time.monotonic() - started, 3))
            else:
                persist.wait_for_commit(step_path, step, world_size, token, self.timeout)
            if rank_info().job_dir and node_copy.enabled():
                node_copy.hold(rank_info().job_dir, rank, step_path)
            self.last_committed_step = step
        except Exception as error:  # a failed save must never take training down
            self.last_error = f"checkpoint at step {step} failed: {error}"
            print(f"jupyter_dlc: {self.last_error}", file=sys.stderr, flush=True)
            if reporter:
                reporter.event("checkpoint", step=step, error=self.last_error)


class CheckpointCorrupt(RuntimeError):
    """This rank's file of the step to restore is not what the step's manifest lists."""


def _refuse_corrupt(path, rank, name, why, manifest):
    """Tell the launcher which file failed (so that its restart takes the newest step that
    verifies), then fail: training on from a corrupt file would go on silently wrong."""
    from .report import send_events_now

    where = f"{os.path.basename(os.path.normpath(path))}/{name}"
    message = f"checkpoint {where} does not match its manifest: {why}; not restoring it"
    send_events_now([{"type": layout.CHECKPOINT_CORRUPT, "step": manifest.get("step"),
                      "path": path, "file": os.path.join(path, name),
                      "manifest_time": manifest.get("time"), "why": why,
                      "message": f"rank {rank}: {message}"}], CORRUPT_REPORT_WAIT)
    raise CheckpointCorrupt(f"{message} (under the launcher, the job restarts from the newest "
                            "step that verifies)")


def _yield_cpu_to_training():
    """Lower this persisting thread's priority: where cores are few, the training thread
    should win them. Linux applies setpriority to a single thread given its native id."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PERSIST_NICENESS)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: persist at normal priority


def _rank_and_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    info = rank_info()
    return info.rank, info.world_size


def _shared_round_token():
    """One token per run, the same on every rank: rank 0 draws it, the others read it from
    the job store (blocking only until rank 0 makes its first save, one step at most)."""
    global _round_token
    if _round_token is None:
        store = job_store()
        if store is None:
            _round_token = uuid.uuid4().hex[:12]
        else:
            info = rank_info()
            key = f"dlc/{info.restart_count}-{info.attempt}/checkpoint-token"
            if dist.get_rank() == 0:
                store.set(key, uuid.uuid4().hex[:12])
            _round_token = store.get(key).decode()
    return _round_token
