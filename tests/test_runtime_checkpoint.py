"""Checkpointer: roundtrip, keep-last, a rank killed mid-persist, a full disk; and the
resumable sampler."""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from jupyter_dlc import layout
from jupyter_dlc.runtime import Checkpointer, ResumableDistributedSampler


def make_training(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3),
                                torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    sampler = ResumableDistributedSampler(40, num_replicas=2, rank=1, shuffle=True, seed=5)
    return model, optimizer, scheduler, sampler


def train_steps(model, optimizer, scheduler, batches):
    for _ in range(batches):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def test_save_restore_roundtrip(tmp_path):
    model, optimizer, scheduler, sampler = make_training()
    indices = iter(sampler)
    consumed = [next(indices) for _ in range(7)]
    train_steps(model, optimizer, scheduler, 3)
    ckpt = Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                        checkpoint_dir=str(tmp_path))
    ckpt.save(3)
    expected_params = {k: v.clone() for k, v in model.state_dict().items()}
    expected_random = (random.random(), np.random.rand(), torch.rand(3))
    expected_rest = list(indices)
    expected_lr = scheduler.get_last_lr()
    assert ckpt.wait()
    assert ckpt.last_committed_step == 3
    train_steps(model, optimizer, scheduler, 2)  # move on, so restore has work to undo

    model2, optimizer2, scheduler2, sampler2 = make_training(seed=99)
    ckpt2 = Checkpointer(model=model2, optimizer=optimizer2, scheduler=scheduler2,
                         sampler=sampler2, checkpoint_dir=str(tmp_path))
    assert ckpt2.restore() == 3
    for name, value in model2.state_dict().items():
        assert torch.equal(value, expected_params[name]), name
    assert scheduler2.get_last_lr() == expected_lr
    assert optimizer2.state_dict()["state"][0]["step"] == 3
    assert (random.random(), np.random.rand()) == expected_random[:2]
    assert torch.equal(torch.rand(3), expected_random[2])
    assert list(sampler2) == expected_rest and len(consumed) + len(expected_rest) == 20


def test_nothing_to_restore_means_step_zero(tmp_path):
    model, optimizer, _, _ = make_training()
    assert Checkpointer(model=model, optimizer=optimizer,
                        checkpoint_dir=str(tmp_path / "none")).restore() == 0


def test_keep_last_deletes_only_older_committed_steps(tmp_path):
    model, optimizer, _, _ = make_training()
    os.makedirs(layout.step_dir(str(tmp_path), 2))  # leftover of a crashed save
    ckpt = Checkpointer(model=model, optimizer=optimizer, checkpoint_dir=str(tmp_path),
                        keep_last=2)
    for step in (1, 3, 4, 5):
        ckpt.save(step)
    ckpt.wait()
    assert [r["step"] for r in layout.committed_steps(str(tmp_path))] == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["step-4", "step-5"]


@pytest.mark.parametrize("length,replicas,drop_last", [(103, 4, False), (103, 4, True),
                                                        (8, 3, False), (12, 4, True)])
def test_sampler_matches_torch_distributed_sampler(length, replicas, drop_last):
    for rank in range(replicas):
        ours = ResumableDistributedSampler(length, replicas, rank, shuffle=True, seed=7,
                                           drop_last=drop_last)
        theirs = DistributedSampler(range(length), replicas, rank, shuffle=True, seed=7,
                                    drop_last=drop_last)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_sampler_resumes_mid_epoch_and_after_epoch_end():
    sampler = ResumableDistributedSampler(30, 3, 2, shuffle=True, seed=1)
    sampler.set_epoch(5)
    assert len(list(sampler)) == 10
    sampler.set_epoch(5)  # the same epoch again (a resume saved at its end): nothing left
    assert list(sampler) == []

    sampler.set_epoch(6)
    whole_epoch = list(_at_epoch(6))
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(4)]
    assert sampler.state_dict() == {"epoch": 6, "position": 4, "replicas": 3, "offset": 0}
    resumed = ResumableDistributedSampler(30, 3, 2, shuffle=True, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    resumed.set_epoch(6)  # what a resumed loop calls first: keeps the position
    tail = list(resumed)
    assert head + tail == whole_epoch
    assert tail == list(iterator)


def _at_epoch(epoch):
    sampler = ResumableDistributedSampler(30, 3, 2, shuffle=True, seed=1)
    sampler.set_epoch(epoch)
    return sampler


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TWO_RANKS = """
    import os, sys, time, torch
    from jupyter_dlc import runtime
    info = runtime.init()
    state = torch.nn.Linear(512, 512)
    ckpt = runtime.Checkpointer(model=state)
    ckpt.save(1)
    assert ckpt.wait()
    print("committed 1", flush=True)
    if info.rank == 0:
        ckpt.save(2)  # rank 1 never saves step 2: rank 0's persist stays in flight
        print("persisting 2", flush=True)
    time.sleep(120)
"""


def test_kill_during_persist_keeps_previous_step(tmp_path, monkeypatch):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(TWO_RANKS))
    ckpt_dir = tmp_path / "ckpt"
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), DLC_CHECKPOINT_DIR=str(ckpt_dir)))
        for rank in (0, 1)]
    try:
        assert procs[0].stdout.readline() == "committed 1\n"
        assert procs[0].stdout.readline() == "persisting 2\n"
        step2 = layout.step_dir(str(ckpt_dir), 2)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(step2, layout.rank_sidecar_name(0))):
            assert time.monotonic() < deadline, "rank 0 never wrote its part of step 2"
            time.sleep(0.02)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert os.path.isdir(step2) and not layout.verify_step(step2)
    latest = layout.latest_committed(str(ckpt_dir))
    assert latest["step"] == 1 and layout.verify_step(latest["path"], deep=True)
    monkeypatch.setenv("WORLD_SIZE", "2")  # load rank 0's part as rank 0 of that world
    model = torch.nn.Linear(512, 512)
    assert Checkpointer(model=model, checkpoint_dir=str(ckpt_dir)).restore() == 1


class BigState:
    """More state than the small file system below can hold."""

    def state_dict(self):
        return {"blob": torch.ones(1 << 20)}  # 4 MiB

    def load_state_dict(self, state):
        pass


@pytest.fixture
def small_filesystem():
    """A 2 MiB file system: tmpfs if we may mount, else a loop-mounted ext2 image."""
    mountpoint = tempfile.mkdtemp(prefix="dlc-full-")
    image = None
    tmpfs = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mountpoint],
                           capture_output=True, text=True)
    if tmpfs.returncode != 0:
        image = mountpoint + ".img"
        loop = subprocess.run(
            f"truncate -s 2M {image} && mkfs.ext2 -q {image} && mount -o loop {image} "
            f"{mountpoint}", shell=True, capture_output=True, text=True)
        if loop.returncode != 0:
            shutil.rmtree(mountpoint)
            pytest.skip("cannot mount a small file system here (tmpfs: "
                        f"{tmpfs.stderr.strip()}; loop: {loop.stderr.strip()})")
    yield mountpoint
    subprocess.run(["umount", mountpoint], check=True)
    os.rmdir(mountpoint)
    if image:
        os.remove(image)


def test_full_disk_keeps_previous_step_and_training_goes_on(small_filesystem, capfd):
    model, optimizer, _, _ = make_training()
    small = Checkpointer(model=model, optimizer=optimizer, checkpoint_dir=small_filesystem)
    small.save(1)
    assert small.wait()

    too_big = Checkpointer(model=model, optimizer=optimizer, big=BigState(),
                           checkpoint_dir=small_filesystem)
    too_big.save(2)  # must not raise: a failed save may not take training down
    assert not too_big.wait()
    assert "No space left on device" in too_big.last_error
    assert "checkpoint at step 2 failed" in capfd.readouterr().err
    assert not os.path.exists(layout.step_dir(small_filesystem, 2))  # its space is free again
    latest = layout.latest_committed(small_filesystem)
    assert latest["step"] == 1 and layout.verify_step(latest["path"], deep=True)
    assert Checkpointer(model=model, optimizer=optimizer,
                        checkpoint_dir=small_filesystem).restore() == 1

    small.save(3)
    assert small.wait()
    assert [r["step"] for r in layout.committed_steps(small_filesystem)] == [1, 3]
