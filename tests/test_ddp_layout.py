"""DDP's rebuilt gradient-bucket layout, carried by the Checkpointer (runtime/ddp_layout.py).

Each case runs in a fresh Python with a real gloo process group of one (DDP rebuilds its
buckets in a world of one too); the 2x2 kill -9 resume is tests/test_recovery.py's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRELUDE = """
import os, sys, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from jupyter_dlc.runtime import Checkpointer
from jupyter_dlc.shims import torch_private as tp
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1))

def step(model, opt):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()

def saved_after_one_step(model, handed=None):
    # A Checkpointer over `model` (or what is handed to it); one step; step 1 committed.
    opt = torch.optim.Adam(model.parameters())
    ckpt = Checkpointer(model=handed or model, optimizer=opt, checkpoint_dir="ck")
    step(model, opt)
    ckpt.save(1)
    assert ckpt.wait()
"""


def run(body: str, tmp_path) -> str:
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + "\n" + proc.stderr


def test_the_rebuilt_layout_is_saved_and_restored_before_the_first_step(tmp_path):
    out = run("""
        model = DDP(net())
        initial = tp.reducer_buckets(model)
        saved_after_one_step(model)
        rebuilt = tp.reducer_buckets(model)
        assert rebuilt != initial, (rebuilt, initial)   # else this test proves nothing

        fresh = DDP(net())
        assert tp.reducer_buckets(fresh) == initial
        ckpt2 = Checkpointer(model=fresh, optimizer=torch.optim.Adam(fresh.parameters()), checkpoint_dir="ck")
        assert ckpt2.restore() == 1
        assert tp.reducer_buckets(fresh) == rebuilt     # the resumed first step sums as the others
        step(fresh, ckpt2.objects["optimizer"])
        step(fresh, ckpt2.objects["optimizer"])
        assert tp.reducer_buckets(fresh) == rebuilt     # its own rebuild lands on the same layout
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in fresh.parameters())
        print("ok")
        """, tmp_path)
    assert "ok" in out.splitlines(), out


def test_a_plain_module_wrapped_by_ddp_is_found(tmp_path):
    """`Checkpointer(model=ddp.module)` (state-dict keys without "module.") works the same."""
    out = run("""
        model = DDP(net())
        saved_after_one_step(model, handed=model.module)
        saved = torch.load("ck/step-1/rank-0.pt", weights_only=False)
        assert saved["ddp_bucket_layout"]["model"] == tp.reducer_buckets(model)
        print("ok")
        """, tmp_path)
    assert "ok" in out.splitlines(), out


def test_a_comm_hook_before_restore_is_said_in_one_line(tmp_path):
    out = run("""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        saved_after_one_step(DDP(net()))
        fresh = DDP(net())
        fresh.register_comm_hook(None, default_hooks.allreduce_hook)
        ckpt2 = Checkpointer(model=fresh, optimizer=torch.optim.Adam(fresh.parameters()), checkpoint_dir="ck")
        assert ckpt2.restore() == 1
        step(fresh, ckpt2.objects["optimizer"])
        """, tmp_path)
    notes = [line for line in out.splitlines() if "bucket layout" in line]
    assert len(notes) == 1, out
    assert "communication hook" in notes[0] and "register_comm_hook" in notes[0]


def test_find_unused_parameters_never_rebuilds_so_nothing_is_carried(tmp_path):
    out = run("""
        model = DDP(net(), find_unused_parameters=True)
        opt = torch.optim.Adam(model.parameters())
        ckpt = Checkpointer(model=model, optimizer=opt, checkpoint_dir="ck")
        initial = tp.reducer_buckets(model)
        for _ in range(2):
            step(model, opt)
        ckpt.save(2)
        assert ckpt.wait()
        assert tp.reducer_buckets(model) == initial
        assert "ddp_bucket_layout" not in torch.load("ck/step-2/rank-0.pt", weights_only=False)
        print("ok")
        """, tmp_path)
    assert "ok" in out.splitlines(), out
