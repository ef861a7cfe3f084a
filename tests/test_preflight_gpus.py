"""Preflight refuses a job that declares GPUs where there are none, before any rank starts.

Runs against this machine's real torch (a CPU-only build) and real device files (none).
"""

from __future__ import annotations

import importlib.util
import os

from jupyter_dlc.launcher.preflight import gpu_check, requested_gpus, run_preflight
from jupyter_dlc.spec import JobSpec

TORCH_DIR = os.path.dirname(importlib.util.find_spec("torch").origin)


def _spec(tmp_path, gpus):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec(script=str(script))
    # `resources` is the engines branch's per-node field; set here so this test runs before
    # and after that merge.
    spec.resources = {"gpus": gpus}
    return spec, str(script)


def test_a_cpu_only_torch_is_refused_when_gpus_are_declared(tmp_path):
    import torch

    assert torch.version.cuda is None, "this test expects the machine's CPU-only torch"
    spec, script = _spec(tmp_path, 2)
    assert requested_gpus(spec) == 2
    checks = run_preflight(spec, script, str(tmp_path / "ckpt"), 0)
    failed = [c for c in checks if not c.ok]
    assert [c.name for c in failed] == ["gpus"], checks
    assert "CPU-only build" in failed[0].detail and "2 GPU(s)" in failed[0].detail


def test_no_visible_device_is_refused_and_nothing_declared_passes(tmp_path):
    check = gpu_check(1, None, 0)
    assert not check.ok and "shows no GPU" in check.detail
    assert not gpu_check(4, None, 2).ok and "only 2 GPU(s)" in gpu_check(4, None, 2).detail
    assert gpu_check(2, None, 2).ok
    assert gpu_check(0, TORCH_DIR, 0) is None
    spec, script = _spec(tmp_path, 0)
    assert all(c.name != "gpus" for c in run_preflight(spec, script, str(tmp_path / "ckpt"), 0))
