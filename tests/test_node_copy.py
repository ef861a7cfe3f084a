"""The node-held shared-memory copy of a committed checkpoint step (runtime/node_copy.py):
taken only when it is exactly the committed file, else the disk is read.

Real files in a real tmpfs-like directory (DLC_SHM_DIR points at the test's own directory so
that parallel test runs never see each other's copies); the job-level tests with real ranks
are in test_recovery.py."""

from __future__ import annotations

import os

import pytest
import torch

from jupyter_dlc import layout
from jupyter_dlc.runtime import node_copy


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setenv("DLC_SHM_DIR", str(tmp_path / "shm"))
    return tmp_path / "shm"


def committed_step(ckpt_dir, step, value):
    """A committed one-rank step written the way persist.py writes it."""
    path = layout.step_dir(str(ckpt_dir), step)
    os.makedirs(path)
    name = layout.rank_file_name(0)
    torch.save({"w": torch.full((4,), float(value)), "step": step}, os.path.join(path, name))
    size = os.path.getsize(os.path.join(path, name))
    layout.write_manifest(path, step, 1, {name: {"size": size, "sha256": layout.sha256_of(
        os.path.join(path, name))}})
    return path


def loaded(content):
    import io

    return torch.load(io.BytesIO(content), weights_only=False)


def test_the_copy_of_the_committed_step_is_used(shm, tmp_path):
    job_dir = str(tmp_path / "jobs" / "j-1")
    step = committed_step(tmp_path / "ckpt", 10, 1.5)
    assert node_copy.hold(job_dir, 0, step)
    content, why = node_copy.load(job_dir, 0, step)
    assert why is None and torch.equal(loaded(content)["w"], torch.full((4,), 1.5))
    assert os.path.dirname(layout.node_copy_dir(job_dir)) == str(shm / f"jupyter-dlc-{os.getuid()}")
    assert oct(os.stat(layout.node_copy_root()).st_mode & 0o777) == "0o700"


def test_a_stale_copy_is_not_used(shm, tmp_path):
    job_dir = str(tmp_path / "jobs" / "j-1")
    older = committed_step(tmp_path / "ckpt", 10, 1.0)
    newer = committed_step(tmp_path / "ckpt", 20, 2.0)
    node_copy.hold(job_dir, 0, older)
    content, why = node_copy.load(job_dir, 0, newer)
    assert content is None and "of step 10, not this one" in why
    # The same step number saved again (a resume from an older step) is another file.
    os.remove(os.path.join(older, layout.MANIFEST))
    torch.save({"w": torch.zeros(4), "step": 10}, os.path.join(older, "rank-0.pt"))
    layout.write_manifest(older, 10, 1, {"rank-0.pt": {
        "size": os.path.getsize(os.path.join(older, "rank-0.pt")),
        "sha256": layout.sha256_of(os.path.join(older, "rank-0.pt"))}})
    content, why = node_copy.load(job_dir, 0, older)
    assert content is None and "not this one" in why


def test_a_corrupted_or_truncated_copy_is_not_used(shm, tmp_path):
    job_dir = str(tmp_path / "jobs" / "j-1")
    step = committed_step(tmp_path / "ckpt", 10, 1.0)
    node_copy.hold(job_dir, 0, step)
    data = os.path.join(layout.node_copy_dir(job_dir), "rank-0.pt")
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    open(data, "wb").write(bytes(raw))
    content, why = node_copy.load(job_dir, 0, step)
    assert content is None and "corrupted" in why
    open(data, "wb").write(bytes(raw[:-10]))
    assert node_copy.load(job_dir, 0, step)[0] is None


def test_no_copy_or_a_torn_sidecar_reads_the_disk(shm, tmp_path):
    job_dir = str(tmp_path / "jobs" / "j-1")
    step = committed_step(tmp_path / "ckpt", 10, 1.0)
    assert node_copy.load(job_dir, 0, step) == (None, "no shared-memory copy on this node")
    node_copy.hold(job_dir, 0, step)
    with open(os.path.join(layout.node_copy_dir(job_dir), "rank-0.pt.json"), "w") as f:
        f.write('{"step_path": ')
    assert node_copy.load(job_dir, 0, step)[0] is None


def test_no_copy_of_a_step_whose_manifest_lacks_the_rank(shm, tmp_path):
    job_dir = str(tmp_path / "jobs" / "j-1")
    step = committed_step(tmp_path / "ckpt", 10, 1.0)
    assert not node_copy.hold(job_dir, 1, step)  # rank 1 is not in a one-rank manifest
    assert not os.path.exists(layout.node_copy_dir(job_dir))


def test_two_launchers_jobs_of_one_id_get_separate_copies(shm, tmp_path):
    a = layout.node_copy_dir(str(tmp_path / "one" / "jobs" / "train-abc123"))
    b = layout.node_copy_dir(str(tmp_path / "two" / "jobs" / "train-abc123"))
    assert a != b
    layout.make_node_copy_dir(str(tmp_path / "one" / "jobs" / "train-abc123"))
    assert layout.node_copy_jobs() == {"train-abc123": a}
    layout.discard_node_copy(a)
    assert not os.path.exists(layout.node_copy_root())  # nothing left once the last goes
