"""Branches: a new job that starts from another job's committed step, running edited code.

At submit the launcher resolves `branch_from` (JOB or JOB@STEP) to one committed step that
verifies, and plants that step in the new job's checkpoint directory: its files hard-linked
(copied where the two directories are on different filesystems) under a temporary name,
then renamed into place whole. From there on the branch is an ordinary job whose newest
committed step is the branch step: its first attempt restores it, a restart before its own
first save restores it again, its checkpoint list starts with it, and neither the parent's
`keep_last` pruning nor the parent's deletion can take it away (the links hold the data).

The spec is stored with `branch_from` rewritten to PARENT_ID@STEP, so the job's lineage,
a clone of it and an export all name the exact step. The ranks learn it as DLC_BRANCH_FROM,
which is how a restore knows that the code may have changed (runtime/restore_state.py).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass

from .. import layout
from ..engines.contract import get_engine
from ..spec import JobSpec, SpecError, parse_branch, show
from . import checkpoints


@dataclass(frozen=True)
class Branch:
    parent: str   # the parent's job id
    step: int
    path: str     # the parent's step directory

    @property
    def ref(self) -> str:
        return f"{self.parent}@{self.step}"


def resolve(store, supervisor, spec: JobSpec) -> Branch | None:
    """The step `spec.branch_from` names, checked against the parent's checkpoint directory;
    None for a job that is no branch. SpecError (naming `branch_from`) when it cannot be."""
    if spec.branch_from is None:
        return None
    if not get_engine(spec.engine).capabilities(spec).branches:
        raise SpecError("branch_from", f"jobs on {spec.engine} branch only where the launcher sees "
                        "their checkpoint directory; set launcher_pvc_dir in the cluster profile")
    ref, step = parse_branch(spec.branch_from)
    parent_id = store.resolve_id(ref)
    row = store.job_row(parent_id) if parent_id else None
    if row is None:
        raise SpecError("branch_from", f"no job {show(ref)}; `jupyter-dlc list` shows the jobs")
    listed = supervisor.checkpoint_steps(row)
    usable = checkpoints.resumable(listed)
    if not usable:
        raise SpecError("branch_from", f"job {row['id']} has no committed checkpoint step to branch "
                        "from; its script must save with runtime.Checkpointer")
    if step is None:
        record = usable[-1]
    else:
        found = [c for c in usable if c["step"] == step]
        if not found:
            listed_there = any(c["step"] == step for c in listed)
            what = "failed verification" if listed_there else "is not a committed checkpoint"
            raise SpecError("branch_from", f"step {step} of job {row['id']} {what}; committed steps "
                            f"that verify: {', '.join(str(c['step']) for c in usable)}")
        record = found[0]
    saved = record.get("world_size")
    if saved is not None and saved != spec.world_size and \
            not (layout.read_manifest(record["path"]) or {}).get("replicated"):
        # A DDP job's step holds the same state on every rank (its manifest says so), and
        # may go on with another world; a sharded or hand-reduced one may not.
        raise SpecError("branch_from", f"{row['id']}@{record['step']} was saved by {saved} ranks and "
                        f"this job has {spec.world_size} ({spec.nodes}x{spec.nproc_per_node}); only a "
                        "DDP job's step can change world size: branch with the parent's --nodes and "
                        "--nproc-per-node")
    return Branch(row["id"], record["step"], record["path"])


def plant(branch: Branch, checkpoint_dir: str) -> str:
    """The branch step placed whole in `checkpoint_dir` (which must hold no committed step
    yet); returns its path there. SpecError when it cannot be."""
    held = layout.committed_steps(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
    if held:
        raise SpecError("checkpoint_dir", f"{checkpoint_dir} already holds committed steps "
                        f"({', '.join(str(c['step']) for c in held[-5:])}); a branch starts in a "
                        "directory of its own: give another --checkpoint-dir, or none")
    target = layout.step_dir(checkpoint_dir, branch.step)
    # Staged under the step's own name (a manifest names its step), in a hidden folder.
    folder = os.path.join(checkpoint_dir, f".branch.{os.getpid()}.tmp")
    staging = os.path.join(folder, os.path.basename(target))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(staging)
    try:
        for name in sorted(os.listdir(branch.path)):
            source = os.path.join(branch.path, name)
            if os.path.isfile(source):
                _link_or_copy(source, os.path.join(staging, name))
        if not layout.verify_step(staging):
            raise FileNotFoundError(errno.ENOENT, "the step changed while it was read", branch.path)
        shutil.rmtree(target, ignore_errors=True)  # an uncommitted leftover of the same number
        os.rename(staging, target)
    except FileNotFoundError:
        raise SpecError("branch_from", f"step {branch.step} of job {branch.parent} was removed while it "
                        "was being branched (its keep_last pruned it); pick a newer step") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return target


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link: instant and no extra space, and the parent's later pruning or deletion
    leaves the data to the branch. A copy where no link can be made (another filesystem)."""
    try:
        os.link(source, destination)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise
        shutil.copy2(source, destination)

