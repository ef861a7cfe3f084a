"""Submit-to-first-step of a 2x2 job through the launcher, against plain torchrun.

Both run the same script with the same topology (2 nodes x 2 processes, gloo, static
rendezvous on 127.0.0.1); the script writes the time of its first training step. The
launcher side submits through LauncherClient, the client the magic uses, to an already
running launcher (a user's every job but the first). Runs alternate, so machine noise hits
both alike; the median ratio is printed last.

    python benchmarks/launch.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from common import free_port, private_launcher, stop_launcher

SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(8, 32)).pow(2).mean()
loss.backward()
opt.step()
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""



def read_time(path: str, timeout: float = 120) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if text:
                return float(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise TimeoutError(path)


def plain_torchrun(script: str, marker: str) -> float:
    port = free_port()
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                               f"--node-rank={node}", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                               f"--master-port={port}", "--max-restarts=0", script, marker],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for node in range(2)]
    first = read_time(marker) - t0
    for proc in procs:
        proc.wait(timeout=120)
    return first


def through_launcher(client, script: str, marker: str) -> float:
    t0 = time.time()
    job = client.submit({"script": script, "args": [marker], "nodes": 2, "nproc_per_node": 2,
                         "max_restarts": 0})
    first = read_time(marker) - t0
    client.wait(job["id"], timeout=120)
    return first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    client, root, script = private_launcher("dlc-bench-launch-", "first_step.py", SCRIPT)
    plain, ours = [], []
    through_launcher(client, script, os.path.join(root, "warmup"))  # page cache, launcher warm
    for rep in range(args.reps):
        for label, run, out in (("torchrun", lambda m: plain_torchrun(script, m), plain),
                                ("launcher", lambda m: through_launcher(client, script, m), ours)):
            marker = os.path.join(root, f"{label}-{rep}")
            out.append(run(marker))
            print(f"rep {rep} {label:8s} first step after {out[-1]:.3f}s", flush=True)
    ratios = [o / p for o, p in zip(ours, plain, strict=True)]
    print(f"median torchrun {statistics.median(plain):.3f}s, launcher {statistics.median(ours):.3f}s")
    stop_launcher(client)
    print(f"ratio launcher/torchrun (median of {args.reps}, target <= 1.10): "
          f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
