"""First-error diagnosis on failures produced for real: small scripts under real torchrun with
our bootstrap (`torchrun --nnodes 1 --nproc-per-node 2 -m jupyter_dlc.runtime.bootstrap`),
the agent's output in node-0.log, exactly as the local backend lays out an attempt.

All scenarios start at once in one module fixture (2 cores here, ~1.8 s of torch import per
process): scenarios that do not need a process group keep torch out of the ranks.

Host OOM: where a memory cgroup can be made (cgroup v2 with the memory controller, else the
v1 memory hierarchy, as on this machine), one rank joins a cgroup with a 64 MiB limit and
allocates until the kernel's OOM killer kills it; dmesg and the cgroup's oom_kill counter are
handed to diagnose() as node evidence. Without a writable memory cgroup that test skips, and
the self-SIGKILL scenario (exit -9 / 137, no evidence) still covers the class.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jupyter_dlc.launcher.diagnosis import diagnose

REPO = Path(__file__).resolve().parents[1]

GLOO = """
import datetime, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
"""

SCRIPTS = {
    # Rank 1 dies by SIGKILL while rank 0 waits for it in all_reduce: rank 0 then fails with
    # "Connection closed by peer" AFTER, and torchrun's own summary calls rank 0 the root cause.
    # The collective timeout is 10 s where it must not fire (8 torchruns share 2 cores here).
    "sigkill": GLOO.replace("TIMEOUT", "10") + """
if rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), 9)
dist.all_reduce(torch.ones(1))
time.sleep(30)
""",
    # Rank 0 raises while rank 1 is blocked in a collective (short gloo timeout).
    "exception": GLOO.replace("TIMEOUT", "10") + """
if rank == 0:
    time.sleep(0.5)
    for step in range(3):
        print(f"step {step} ok", flush=True)
    raise ValueError("labels and logits disagree: (8,) vs (8, 10)")
dist.all_reduce(torch.ones(1))
time.sleep(30)
""",
    # Rank 1 never joins the collective: rank 0 times out after 3 s.
    "timeout": GLOO.replace("TIMEOUT", "3") + """
if rank == 1:
    time.sleep(60)
dist.all_reduce(torch.ones(1))
""",
    # The failures below need no process group; rank 0 waits until its agent stops it.
    "module": """
import os, time
if os.environ["RANK"] == "1":
    import tokenizers_that_are_not_installed
time.sleep(60)
""",
    "datafile": """
import os, time
if os.environ["RANK"] == "1":
    print("loading shards", flush=True)
    open("data/train-00000-of-00008.bin", "rb")
time.sleep(60)
""",
    "nan": """
import os, time
class NonFiniteLossError(RuntimeError):
    pass
if os.environ["RANK"] == "0":
    for step in range(1, 4):
        print(f"step {step} loss 0.{9 - step}", flush=True)
    raise NonFiniteLossError("loss is nan at step 4; stopped, last good checkpoint kept")
time.sleep(60)
""",
    # Preemption: the test SIGTERMs the torchrun agent, which passes SIGTERM to the ranks.
    # Rank 0 is a plain script (dies of the signal, -15); rank 1 behaves like our runtime
    # (checkpoint, then a clean exit 0).
    "preempt": """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("training", flush=True)
time.sleep(60)
""",
    # Allocates until its memory cgroup's limit makes the kernel kill it.
    "oom": """
import os, time
if os.environ["RANK"] == "1":
    with open(os.environ["OOM_CGROUP_PROCS"], "w") as f:
        f.write(str(os.getpid()))
    print("allocating", flush=True)
    hog = []
    while True:
        hog.append(bytearray(8 << 20))
        hog[-1][::4096] = b"x" * len(hog[-1][::4096])
time.sleep(60)
""",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_cgroup(name: str) -> tuple[Path, Path, Path] | None:
    """(cgroup dir, its procs file, its oom-kill counter file) with a 64 MiB limit, or None."""
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        candidates = [(v2, "memory.max", "memory.events")]
    else:
        candidates = [(v2 / "memory", "memory.limit_in_bytes", "memory.oom_control")]
    for root, limit, counter in candidates:
        path = root / name
        try:
            path.mkdir()
            (path / limit).write_text(str(64 << 20))
            return path, path / "cgroup.procs", path / counter
        except OSError:
            if path.exists():
                path.rmdir()
    return None


def _dmesg() -> str:
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("diag")
    cgroup = _memory_cgroup(f"dlc-test-{os.getpid()}")
    procs = {}
    for name, body in SCRIPTS.items():
        if name == "oom" and cgroup is None:
            continue
        attempt = base / name / "attempt-1"
        attempt.mkdir(parents=True)
        script = base / name / "script.py"
        script.write_text(textwrap.dedent(body))
        env = {**os.environ, "DLC_ATTEMPT_DIR": str(attempt), "PYTHONPATH": str(REPO)}
        if cgroup:
            env["OOM_CGROUP_PROCS"] = str(cgroup[1])
        log = open(attempt / "node-0.log", "w")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--master-port", str(_free_port()), "-m", "jupyter_dlc.runtime.bootstrap", str(script)]
        procs[name] = (subprocess.Popen(cmd, cwd=base / name, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True), attempt, log)
    try:
        # Preempt once both ranks are training, as a platform would at any moment.
        agent, attempt, _ = procs["preempt"]
        logs = [attempt / f"rank-{r}.log" for r in (0, 1)]
        deadline = time.time() + 60
        while time.time() < deadline and not all(p.exists() and "training" in p.read_text() for p in logs):
            time.sleep(0.2)
        agent.send_signal(signal.SIGTERM)
        results = {}
        for name, (proc, attempt, log) in procs.items():
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
            results[name] = attempt
        info = {}
        if cgroup:
            counter = cgroup[2].read_text()
            kills = next((int(l.split()[1]) for l in counter.splitlines() if l.startswith("oom_kill ")), 0)
            info = {0: {"kernel_log": _dmesg(), "oom_kill": kills}}
        yield results, info
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if cgroup:
            try:
                cgroup[0].rmdir()
            except OSError:
                pass


def _check(result, cls, rank, line_has):
    assert result is not None
    assert (result["class"], result["rank"]) == (cls, rank), result
    assert line_has in result["line"], result["line"]
    assert result["node"] == 0
    assert isinstance(result["time"], float)
    assert isinstance(result["context"], list) and len(result["context"]) <= 20
    assert result["suggestion"] and "\n" not in result["suggestion"]


def test_sigkill_beats_the_connection_closed_echo(runs):
    results, _ = runs
    attempt = results["sigkill"]
    # torchrun's summary blames rank 0 (its "first observed failure"); the truth is rank 1.
    assert "Connection closed by peer" in (attempt / "rank-0.log").read_text()
    for exits in ({}, {0: 1, 1: 137}):  # exit codes found in the files, or given by the launcher
        result = diagnose(str(attempt), exits)
        _check(result, "host_oom", 1, "SIGKILL")
        assert "rank 1" in result["suggestion"] and "host memory" in result["suggestion"]
    assert diagnose(str(attempt), {})["exit_code"] == -9
    assert diagnose(str(attempt), {0: 1, 1: 137})["exit_code"] == 137
    # Its context is what the killed rank was doing last.
    assert diagnose(str(attempt), {})["context"][-1] == "rank 1 joined"


def test_exception_on_one_rank_while_the_other_blocks_in_a_collective(runs):
    results, _ = runs
    result = diagnose(str(results["exception"]), {0: 1, 1: 1})
    _check(result, "user_exception", 0, "ValueError: labels and logits disagree")
    assert "script.py:" in result["suggestion"]
    assert "step 2 ok" in result["context"] and "Traceback (most recent call last):" in result["context"]


def test_collective_timeout_names_the_rank_that_never_joined(runs):
    results, _ = runs
    result = diagnose(str(results["timeout"]), {})
    _check(result, "collective_timeout", 0, "Timed out waiting")
    assert "rank(s) 1 never joined" in result["suggestion"]


def test_missing_module(runs):
    result = diagnose(str(runs[0]["module"]), {})
    _check(result, "missing_module", 1, "No module named 'tokenizers_that_are_not_installed'")
    assert "'tokenizers_that_are_not_installed'" in result["suggestion"]


def test_missing_data_file(runs):
    result = diagnose(str(runs[0]["datafile"]), {})
    _check(result, "missing_file", 1, "FileNotFoundError")
    assert "data/train-00000-of-00008.bin" in result["suggestion"]
    assert result["context"][0] == "loading shards"


def test_nan_loss(runs):
    result = diagnose(str(runs[0]["nan"]), {})
    _check(result, "nan_loss", 0, "NonFiniteLossError: loss is nan at step 4")
    assert result["context"][:3] == ["step 1 loss 0.8", "step 2 loss 0.7", "step 3 loss 0.6"]


def test_sigterm_preemption(runs):
    """The agent dies of the SIGTERM before it can summarise, so rank 0's -15 is on record only
    where the launcher saw it; either way rank 0 (which left no end record) is named."""
    attempt = str(runs[0]["preempt"])
    result = diagnose(attempt, {})
    _check(result, "preempted", 0, "death signal")
    assert result["exit_code"] is None and "resume" in result["suggestion"]
    result = diagnose(attempt, {0: -15, 1: 0})
    _check(result, "preempted", 0, "death signal")
    assert result["exit_code"] == -15


def test_host_oom_by_the_kernel(runs):
    results, info = runs
    if "oom" not in results:
        pytest.skip("no writable memory cgroup here; the sigkill scenario covers exit 137")
    attempt = results["oom"]
    assert info[0]["oom_kill"] >= 1
    result = diagnose(str(attempt), {}, nodes_info=info)
    _check(result, "host_oom", 1, "")
    assert "by the kernel's OOM killer" in result["suggestion"]
    without = diagnose(str(attempt), {})
    assert (without["class"], without["rank"]) == ("host_oom", 1)
    assert "most likely" in without["suggestion"]


def test_no_failure_is_no_diagnosis(tmp_path):
    (tmp_path / "rank-0.json").write_text('{"pid": 1, "node": 0, "start": 1.0, "end": 2.0, "exit_code": 0}')
    (tmp_path / "rank-0.log").write_text("done\n")
    assert diagnose(str(tmp_path), {0: 0}) is None


def test_chained_error_is_classed_by_its_first_exception(tmp_path):
    """A FileNotFoundError that surfaces as an ImportError is a missing file (seeds/003)."""
    (tmp_path / "rank-0.log").write_text(textwrap.dedent("""\
        Traceback (most recent call last):
          File "/work/cfg.py", line 3, in <module>
        FileNotFoundError: [Errno 2] No such file or directory: '/data/vocab.txt'

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "/work/train.py", line 1, in <module>
        ImportError: cannot import name 'VOCAB' from 'cfg'
        """))
    (tmp_path / "rank-0.error.json").write_text(
        '{"t": 5.0, "rank": 0, "node": 0, "type": "ImportError", "message": "cannot import name", "traceback": ""}')
    result = diagnose(str(tmp_path), {0: 1})
    assert (result["class"], result["rank"]) == ("missing_file", 0)
    assert result["line"].startswith("FileNotFoundError")
    assert "'/data/vocab.txt'" in result["suggestion"]
