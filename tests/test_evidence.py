"""The evidence folder (launcher/evidence.py) over real processes and the real py-spy (a test
extra): a hang keeps every live rank's native stacks, taken side by side; a crash does not
wait for them (its restart is what users feel), and says so in the index."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jupyter_dlc import layout
from jupyter_dlc.launcher import evidence

SLEEPER = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"  # in its sleep, not still importing
    yield {rank: proc.pid for rank, proc in enumerate(procs)}
    for proc in procs:
        proc.kill()
        proc.wait()


def _attempt_dir(tmp_path) -> str:
    path = tmp_path / "attempt-1"
    path.mkdir()
    for rank in range(2):
        (path / os.path.basename(layout.rank_log(str(path), rank))).write_text(f"rank {rank} last words\n")
    return str(path)


def test_a_hang_keeps_native_stacks_of_every_live_rank(tmp_path, sleepers):
    if not evidence._tool("py-spy"):
        pytest.fail("py-spy is a test extra (pip install -e '.[test]'): the set-up did not install it")
    attempt_dir = _attempt_dir(tmp_path)
    index = evidence.keep_scene(attempt_dir, 1, "no step progress: a hang", 2, None, sleepers,
                                ranks_here=True, hung=True)
    names = {f["name"] for f in index["files"]}
    assert {"native-rank-0.txt", "native-rank-1.txt", "logs-tail.txt"} <= names, index
    for rank in range(2):
        with open(os.path.join(evidence.evidence_dir(attempt_dir), f"native-rank-{rank}.txt")) as f:
            assert "time_sleep" in f.read()  # the interpreter's C frame under the sleep
    with open(os.path.join(evidence.evidence_dir(attempt_dir), "index.json")) as f:
        assert json.load(f)["files"] == index["files"]


def test_a_crash_does_not_wait_for_native_stacks(tmp_path, sleepers):
    attempt_dir = _attempt_dir(tmp_path)
    index = evidence.keep_scene(attempt_dir, 1, "rank 1 exited with code 137", 2, None, sleepers,
                                ranks_here=True, hung=False)
    names = {f["name"] for f in index["files"]}
    assert not any(name.startswith("native-") for name in names), names
    assert any("native stacks: kept for hang verdicts" in why for why in index["skipped"]), index
    with open(os.path.join(evidence.evidence_dir(attempt_dir), "logs-tail.txt")) as f:
        tail = f.read()
    assert "rank 1 last words" in tail and "== rank 0 ==" in tail, tail


def test_a_command_past_its_time_is_killed_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "COMMAND_SECONDS", 0.3)
    folder = evidence._Folder(str(tmp_path), float("inf"))
    folder.run_all([("slow.txt", "a command that hangs", [sys.executable, "-c", "import time; time.sleep(60)"]),
                    ("fast.txt", "a quick one", [sys.executable, "-c", "print('done')"])])
    assert [f["name"] for f in folder.files] == ["fast.txt"], folder.files
    assert folder.skipped and folder.skipped[0].startswith("slow.txt: ") and "took over 0.3 s" in folder.skipped[0]


def test_nvidia_smi_on_a_gpu_node_is_kept_and_its_absence_said(tmp_path, monkeypatch):
    """`nvidia-smi -q` goes into the folder where it is on PATH and the ranks run here. No GPU
    (nor nvidia-smi) can be on this machine, so a stand-in executable on PATH prints what
    `nvidia-smi -q` would, and fails unless asked for `-q`; the rest is the real keep_scene."""
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = -q ] || exit 2\n"
                   "printf '==============NVSMI LOG==============\\nAttached GPUs : 1\\n'\n")
    smi.chmod(0o755)
    bare_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{bare_path}")

    def scene(name: str, ranks_here: bool) -> dict:
        (tmp_path / name).mkdir()
        return evidence.keep_scene(_attempt_dir(tmp_path / name), 1, "a hang", 2, None, {},
                                   ranks_here=ranks_here, hung=True)

    gpu = scene("gpu", ranks_here=True)
    assert "nvidia-smi.txt" in {f["name"] for f in gpu["files"]}, gpu
    with open(os.path.join(evidence.evidence_dir(str(tmp_path / "gpu" / "attempt-1")), "nvidia-smi.txt")) as f:
        kept = f.read()
    assert "NVSMI LOG" in kept and "Attached GPUs : 1" in kept, kept
    # The ranks on other hosts: this machine's GPUs are not theirs.
    elsewhere = scene("elsewhere", ranks_here=False)
    assert "nvidia-smi.txt" not in {f["name"] for f in elsewhere["files"]}
    assert "nvidia-smi -q: the ranks run on other hosts" in elsewhere["skipped"], elsewhere
    # No nvidia-smi: a CPU node, said so.
    monkeypatch.setenv("PATH", bare_path)
    if evidence.shutil.which("nvidia-smi") is None:  # (a machine with a GPU has the real one)
        cpu = scene("cpu", ranks_here=True)
        assert "nvidia-smi -q: not on PATH (no GPU node)" in cpu["skipped"], cpu
