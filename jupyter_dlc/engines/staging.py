"""What engines whose nodes do not see the launcher's job directory have in common (SSH and
Slurm with `shared_filesystem: false`): the job's script and pushed files travel with the
job (`staged_files`, decoded on the node by `ssh_node.stage`), and checkpoints need a
directory the nodes and the launcher both see (the profile's `checkpoint_dir`, or the spec's).
"""

from __future__ import annotations

import base64
import os

from ..spec import JobSpec

# What a job without a shared filesystem may carry to each node, before encoding.
STAGE_LIMIT = 32 * 2**20


def staged_size(spec: JobSpec) -> int:
    """Bytes of the script and pushed files that a job without a shared filesystem sends."""
    paths = list(spec.files.values()) + ([] if spec.code is not None else [spec.script])
    size = len((spec.code or "").encode())
    for path in paths:
        try:
            size += os.path.getsize(path) if path else 0
        except OSError:
            pass
    return size


def staged_files(job_dir: str) -> dict[str, str]:
    """The job directory's script and pushed files (relative name -> base64), as they travel
    to nodes that do not share the launcher's filesystem."""
    pushed = os.path.join(job_dir, "files")
    names = ["script.py"] + [os.path.join("files", n) for n in
                             (sorted(os.listdir(pushed)) if os.path.isdir(pushed) else [])
                             if os.path.isfile(os.path.join(pushed, n))]
    staged = {}
    for name in names:
        with open(os.path.join(job_dir, name), "rb") as f:
            staged[name] = base64.b64encode(f.read()).decode()
    return staged


def spec_files(spec: JobSpec) -> dict[str, str]:
    """What `staged_files` will hold for `spec` once its job directory is made (the script as
    the launcher writes it, the pushed files by their names), read from where the spec
    points: for checks at submit, before the job directory exists."""
    def encoded(path: str) -> str:
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()

    code = spec.code if spec.code is None or spec.code.endswith("\n") else spec.code + "\n"
    staged = {"script.py": base64.b64encode(code.encode()).decode() if code is not None
              else encoded(spec.script or "")}
    staged.update({os.path.join("files", name): encoded(path) for name, path in sorted(spec.files.items())})
    return staged


def size_error(spec: JobSpec, cluster: str, how: str, what: str) -> str | None:
    """The one-line refusal of a job whose files are over STAGE_LIMIT (`how` they travel,
    `what` the nodes are called), else None."""
    size = staged_size(spec)
    if size <= STAGE_LIMIT:
        return None
    return (f"files: the script and pushed files take {size / 2**20:.1f} MiB, over the "
            f"{STAGE_LIMIT // 2**20} MiB that travel {how} to cluster {cluster} "
            f"(shared_filesystem: false); push less, or share a filesystem with the {what}")


def checkpoint_dir_error(spec: JobSpec, profile, what: str) -> str | None:
    """Without a shared filesystem a job needs a checkpoint directory that the nodes (`what`:
    "hosts", "nodes") and the launcher see: the spec's or the profile's."""
    if spec.checkpoint_dir or profile.get("checkpoint_dir"):
        return None
    return (f"cluster {profile.name}: checkpoint_dir: the {what} do not share the launcher's "
            "job directory (shared_filesystem: false), so checkpoints need a directory every "
            f"{what[:-1]} and this machine see; set checkpoint_dir: PATH in the profile or pass "
            "--checkpoint-dir")


def profile_checkpoint_dir(spec: JobSpec, profile, job_id: str) -> str | None:
    """The profile's `checkpoint_dir/<job>` where the spec names none, else None (the
    engine's default: the spec's, or the job directory's)."""
    base = profile.get("checkpoint_dir")
    if spec.checkpoint_dir or not base:
        return None
    return os.path.join(os.path.expanduser(str(base)), job_id)
