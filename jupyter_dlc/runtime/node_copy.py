"""A copy of this rank's part of the newest committed step, held in the node's shared memory.

As DLRover's flash checkpoint does: a restarted rank on the same node reads its state from
memory instead of the checkpoint directory (a network file system on a cluster). Each rank,
once a step is committed, copies its file to `layout.node_copy_dir(job_dir)/rank-R.pt`
(tmpfs: it outlives the rank process, not the node) with a sidecar naming the step and the
manifest's size and sha256 for it. A restore takes the copy only when it is that exact
committed file: same step directory, and the bytes hash to what the manifest lists.
Anything else (absent, older, torn, corrupted) is reported and the checkpoint directory is
read, as before. The launcher removes the directory when the job ends, stops or is deleted.
"""

import hashlib
import json
import os
import shutil
import sys

from .. import layout


def enabled():
    """The launcher sets DLC_NODE_COPY=1 where it can remove the copies again (its own
    machine's nodes); elsewhere no rank writes one."""
    return os.environ.get("DLC_NODE_COPY") == "1"


def _paths(job_dir, rank):
    data = os.path.join(layout.node_copy_dir(job_dir), layout.rank_file_name(rank))
    return data, f"{data}.json"


def hold(job_dir, rank, step_path):
    """After `step_path` committed: replace this node's copy of the rank's file with it.
    Best effort: without shared memory (or room in it) restores read the disk."""
    manifest = layout.read_manifest(step_path)
    record = (manifest or {}).get("files", {}).get(layout.rank_file_name(rank))
    if record is None:
        return False
    data, sidecar = _paths(job_dir, rank)
    tmp = os.path.join(os.path.dirname(data), f".{os.path.basename(data)}.tmp")
    try:
        layout.make_node_copy_dir(job_dir)
        # The sidecar goes first: from here until the new one is written, no copy counts.
        _remove_quietly(sidecar)
        shutil.copyfile(os.path.join(step_path, layout.rank_file_name(rank)), tmp)
        os.replace(tmp, data)
        meta = {"step_path": os.path.abspath(step_path), "step": manifest["step"],
                "size": record["size"], "sha256": record["sha256"]}
        layout.write_json(sidecar, meta)
        return True
    except OSError as error:
        _remove_quietly(tmp)
        print(f"jupyter_dlc: no shared-memory copy of step {manifest['step']}: {error}",
              file=sys.stderr, flush=True)
        return False


def load(job_dir, rank, step_path):
    """(the bytes of the rank's file from this node's copy, None) when the copy is exactly
    the committed file of `step_path`; else (None, why the disk is read instead)."""
    manifest = layout.read_manifest(step_path)
    record = (manifest or {}).get("files", {}).get(layout.rank_file_name(rank))
    data, sidecar = _paths(job_dir, rank)
    try:
        with open(sidecar) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None, "no shared-memory copy on this node"
    if record is None or meta.get("step_path") != os.path.abspath(step_path) or \
            meta.get("sha256") != record.get("sha256"):
        return None, f"the shared-memory copy is of step {meta.get('step')}, not this one"
    try:
        with open(data, "rb") as f:
            content = f.read()
    except OSError as error:
        return None, f"the shared-memory copy cannot be read: {error}"
    if len(content) != record["size"] or hashlib.sha256(content).hexdigest() != record["sha256"]:
        return None, "the shared-memory copy does not match the manifest (corrupted)"
    return content, None


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
