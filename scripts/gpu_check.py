"""The GPU path, checked on one GPU machine: run by scripts/gpu-check.sh (at most 8 minutes).

Each check prints exactly one line, `gpu-check NAME: PASS|FAIL|ERROR detail`, whatever
happens (a check that raises or times out is an ERROR line, never a traceback only), and
the process exits non-zero if any line is not a PASS. The jobs go through the real launcher
(`jupyter-dlc run`) in a throwaway data directory, as a user's would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

RESULTS: list[str] = []


def report(name: str, ok: bool, detail: str) -> None:
    line = f"gpu-check {name}: {'PASS' if ok else 'FAIL'} {detail}"
    RESULTS.append(line)
    print(line, flush=True)


def check(name: str):
    def wrap(fn):
        def run(*args):
            try:
                fn(*args)
            except Exception as error:  # noqa: BLE001 - one ERROR line per broken check
                last = traceback.format_exc().strip().splitlines()[-1]
                line = f"gpu-check {name}: ERROR {type(error).__name__}: {str(error)[:300] or last}"
                RESULTS.append(line)
                print(line, flush=True)
        return run
    return wrap


class Launcher:
    """A launcher of our own in a temporary data dir; `run` submits a script and waits."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="dlc-gpu-check-")
        self.env = {**os.environ, "DLC_DATA_DIR": os.path.join(self.dir, "data"),
                    "JUPYTER_RUNTIME_DIR": os.path.join(self.dir, "runtime"),
                    "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def script(self, name: str, body: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(body))
        return path

    def run(self, path: str, *args: str, timeout: float = 150) -> tuple[str, int, str]:
        """(job id, exit status of `run --wait`, its output)."""
        proc = self.cli("run", path, "--nodes", "1", "--nproc-per-node", "1", "--wait", *args,
                        timeout=timeout)
        job = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
        return job, proc.returncode, proc.stdout + proc.stderr

    def logs(self, job: str) -> str:
        return self.cli("logs", job).stdout

    def close(self) -> None:
        try:
            self.cli("launcher", "stop", timeout=30)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@check("env-contract-nccl-1x1")
def env_contract(launcher: Launcher) -> None:
    path = launcher.script("env_nccl.py", """
        import json, os, torch, torch.distributed as dist
        from jupyter_dlc import runtime
        info = runtime.init(backend="nccl")
        torch.cuda.set_device(info.local_rank)
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DLC_JOB_ID",
                "DLC_ATTEMPT", "DLC_CHECKPOINT_DIR"]
        print("ENV " + json.dumps({"backend": dist.get_backend(), "sum": t.item(),
                                   **{k: os.environ.get(k) for k in keys}}), flush=True)
        """)
    job, code, out = launcher.run(path, timeout=90)
    found = re.search(r"ENV (\{.*\})", launcher.logs(job) if job else out)
    if not found:
        report("env-contract-nccl-1x1", False, f"no ENV line (exit {code}): {out[-300:]!r}")
        return
    env = json.loads(found.group(1))
    missing = [k for k, v in env.items() if v in (None, "")]
    ok = code == 0 and env["backend"] == "nccl" and env["sum"] == 1.0 and not missing
    report("env-contract-nccl-1x1", ok, f"backend={env['backend']} all_reduce={env['sum']} "
           f"world={env['WORLD_SIZE']} missing={missing or 'none'}")


@check("sampler-vs-nvidia-smi")
def sampler_vs_smi(_launcher: Launcher) -> None:
    from jupyter_dlc.runtime.system import open_source

    source = open_source()
    busy = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time, torch
        a = torch.randn(8192, 8192, device="cuda"); b = torch.randn(8192, 8192, device="cuda")
        hold = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")   # 4 GiB held
        end = time.time() + 25
        while time.time() < end:
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
        """)])
    ours, smi = [], []
    try:
        time.sleep(8)  # the loop and its allocation are up
        for _ in range(10):
            sample = dict(source.sample()).get("gpu0", {})
            query = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu,memory.used,memory.total",
                                    "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                   timeout=10).stdout.split(",")
            ours.append((sample.get("gpu_util"), sample.get("gpu_mem")))
            smi.append((float(query[0]) / 100, float(query[1]) / float(query[2])))
            time.sleep(1)
    finally:
        busy.kill()
        busy.wait()
    if any(u is None or m is None for u, m in ours):
        report("sampler-vs-nvidia-smi", False, f"our sampler gave no gpu0 util/memory: {source.sample()!r:.200}")
        return
    util_ours, util_smi = statistics.median(u for u, _ in ours), statistics.median(u for u, _ in smi)
    mem_ours, mem_smi = statistics.median(m for _, m in ours), statistics.median(m for _, m in smi)
    ok = abs(util_ours - util_smi) <= 0.15 and abs(mem_ours - mem_smi) <= 0.02
    report("sampler-vs-nvidia-smi", ok, f"util ours {util_ours:.2f} vs smi {util_smi:.2f}; memory used "
           f"ours {mem_ours:.3f} vs smi {mem_smi:.3f} of total (tolerance 0.15, 0.02)")


@check("checkpoint-stall")
def checkpoint_stall(launcher: Launcher) -> None:
    import torch

    from jupyter_dlc.runtime import Checkpointer

    torch.manual_seed(0)
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(32 << 20, device="cuda"))
                                   for _ in range(8))  # 1 GiB of weights
    ckpt_dir = os.path.join(launcher.dir, "ckpt")
    ckpt = Checkpointer(model=model, checkpoint_dir=ckpt_dir, keep_last=1)
    pinned = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in model.parameters()]

    def timed(fn) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def floor() -> None:
        for buffer, p in zip(pinned, model.parameters(), strict=True):
            buffer.copy_(p.detach(), non_blocking=True)

    stalls, floors, saves = [], [], []
    for step in range(1, 4):
        stalls.append(timed(lambda step=step: ckpt.save(step)))
        ckpt.wait()
        floors.append(timed(floor))
        saves.append(timed(lambda: torch.save(model.state_dict(), os.path.join(launcher.dir, "plain.pt"))))
    stall, low, plain = (statistics.median(x) for x in (stalls, floors, saves))
    ok = stall <= 3 * low and stall < plain
    report("checkpoint-stall", ok, f"1 GiB: save() stall {stall * 1000:.0f} ms = {stall / low:.2f}x the pinned "
           f"D2H floor ({low * 1000:.0f} ms), {stall / plain:.2f}x torch.save ({plain * 1000:.0f} ms)")


@check("cuda-oom-diagnosis")
def cuda_oom(launcher: Launcher) -> None:
    path = launcher.script("oom.py", """
        import torch
        hog = []
        while True:
            hog.append(torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
        """)
    job, code, out = launcher.run(path, timeout=90)
    why = launcher.cli("why", job).stdout if job else ""
    ok = code != 0 and "cuda_oom" in why
    first = next((line for line in why.splitlines() if line.startswith("attempt")), why[:200])
    report("cuda-oom-diagnosis", ok, f"exit {code}; why: {first.strip()!r}")


TUTORIAL = """
    # The PyTorch multi-GPU tutorial's shape: LOCAL_RANK device, nccl, DistributedSampler,
    # a snapshot saved each epoch and loaded if present. Written here, not copied.
    import os, sys, torch, torch.nn as nn, torch.nn.functional as F
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    snapshot, epochs = sys.argv[1], int(sys.argv[2])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    data = TensorDataset(torch.randn(2048, 20), torch.randn(2048, 1))
    loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data))
    model = nn.Linear(20, 1).to(local_rank)
    start = 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot, map_location=f"cuda:{local_rank}")
        model.load_state_dict(state["MODEL_STATE"])
        start = state["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {start}", flush=True)
    model = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(start, epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(local_rank), y.to(local_rank)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        if int(os.environ["RANK"]) == 0:
            torch.save({"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch + 1}, snapshot)
            print(f"Epoch {epoch} | snapshot saved", flush=True)
    dist.destroy_process_group()
"""


@check("tutorial-ddp-1x1")
def tutorial_ddp(launcher: Launcher) -> None:
    path = launcher.script("tutorial_ddp.py", TUTORIAL)
    snapshot = os.path.join(launcher.dir, "snapshot.pt")
    first, code1, out1 = launcher.run(path, snapshot, "2", timeout=120)
    second, code2, out2 = launcher.run(path, snapshot, "3", timeout=120)
    resumed = "Resuming training from snapshot at Epoch 2" in launcher.logs(second)
    ok = code1 == 0 and code2 == 0 and resumed
    detail = f"first run exit {code1}, second run exit {code2}, resumed from epoch 2: {resumed}"
    if not ok:
        detail += f"; {(out2 or out1)[-300:]!r}"
    report("tutorial-ddp-1x1", ok, detail)


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no usable GPU (torch {torch.__version__}, torch.version.cuda="
              f"{torch.version.cuda}); nothing was checked", flush=True)
        return 2
    # name -> (check, seconds it may take): together under the script's 8 minutes.
    checks = {"env": (env_contract, 90), "sampler": (sampler_vs_smi, 60),
              "checkpoint": (checkpoint_stall, 90), "oom": (cuda_oom, 90), "tutorial": (tutorial_ddp, 120)}
    wanted = sys.argv[1:] or list(checks)
    unknown = [name for name in wanted if name not in checks]
    if unknown:
        print(f"gpu-check: unknown check(s) {unknown}; choose from {list(checks)}", flush=True)
        return 2
    launcher = Launcher()
    try:
        for name in wanted:
            fn, seconds = checks[name]
            runner = threading.Thread(target=fn, args=(launcher,), daemon=True)
            runner.start()
            runner.join(seconds)
            if runner.is_alive():
                line = f"gpu-check {name}: ERROR did not finish within {seconds} s"
                RESULTS.append(line)
                print(line, flush=True)
    finally:
        launcher.close()
    return 0 if RESULTS and all(": PASS " in line for line in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
