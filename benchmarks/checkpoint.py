"""Training-thread stall of Checkpointer.save() for ~500 MB of state, against the two
alternatives in the same run: a synchronous torch.save of the same state, and the floor (a
bare copy of every tensor into preallocated host memory). Then the step time of a training
loop while a persist runs in the background, against the same loop with no save.

    python benchmarks/checkpoint.py [--mb 500] [--repeats 3]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402
from jupyter_dlc.runtime import Checkpointer  # noqa: E402


def make_state(total_mb):
    """Model + SGD momentum, half the bytes each, in 32 MB parameters."""
    numel = 8 << 20
    count = max(1, total_mb // 2 // 32)
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(numel)) for _ in range(count))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # creates the momentum buffers
    return model, optimizer


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bare_copy(model, optimizer, buffers):
    """The floor: every tensor of the state copied once into host memory already there."""
    tensors = list(model.state_dict().values()) + [
        s["momentum_buffer"] for s in optimizer.state_dict()["state"].values()]
    if not buffers:
        buffers.extend(torch.empty_like(t) for t in tensors)
    for buffer, tensor in zip(buffers, tensors, strict=True):
        buffer.copy_(tensor)


def training_step(a, b):
    """About the compute of a small model's step, on one thread."""
    for _ in range(4):
        a = torch.tanh(a @ b)
    return a


def step_times(a, b, until=None, steps=None):
    times = []
    while (until is not None and until()) or (steps is not None and len(times) < steps):
        times.append(timed(lambda: training_step(a, b)))
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    results.add_argument(parser)
    args = parser.parse_args()
    host = results.Host.now()
    print(f"host at start: {host}", flush=True)
    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for every worker

    model, optimizer = make_state(args.mb)
    state_mb = sum(t.numel() * t.element_size() for t in model.parameters()) * 2 / 2**20
    workdir = tempfile.mkdtemp(prefix="dlc-bench-", dir=os.environ.get("BENCH_DIR"))
    ckpt = Checkpointer(model=model, optimizer=optimizer, checkpoint_dir=workdir, keep_last=1)

    buffers = []
    bare_copy(model, optimizer, buffers)  # allocate and fault in once, like save() does
    floor = [timed(lambda: bare_copy(model, optimizer, buffers)) for _ in range(args.repeats)]
    sync_path = os.path.join(workdir, "sync.pt")
    sync = [timed(lambda: torch.save({"model": model.state_dict(),
                                      "optimizer": optimizer.state_dict()}, sync_path))
            for _ in range(args.repeats)]
    os.remove(sync_path)
    first_stall = timed(lambda: ckpt.save(1))
    ckpt.wait()
    stalls, persists = [], []
    for step in range(2, 2 + args.repeats):
        stalls.append(timed(lambda step=step: ckpt.save(step)))
        persists.append(timed(ckpt.wait) + stalls[-1])

    a, b = torch.randn(256, 512), torch.randn(512, 512) / 24
    step_times(a, b, steps=50)  # warm up
    idle = step_times(a, b, steps=300)
    ckpt.save(100)
    busy = step_times(a, b, until=lambda: ckpt._thread.is_alive())
    ckpt.wait()
    shutil.rmtree(workdir)

    floor_s, sync_s, stall_s = (statistics.median(x) for x in (floor, sync, stalls))
    idle_ms, busy_ms = statistics.median(idle) * 1e3, statistics.median(busy) * 1e3
    print(f"state: {state_mb:.0f} MB in {len(buffers)} tensors, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, dir {workdir}")
    print(f"bare copy to host (floor):   {floor_s * 1e3:8.1f} ms  (median of {args.repeats})")
    print(f"torch.save, synchronous:     {sync_s * 1e3:8.1f} ms")
    print(f"save() stall, first save:    {first_stall * 1e3:8.1f} ms  (allocates host buffers)")
    print(f"save() stall, steady state:  {stall_s * 1e3:8.1f} ms")
    print(f"background persist + commit: {statistics.median(persists) * 1e3:8.1f} ms "
          "(serialise, sha256, fsync, manifest)")
    print(f"step, no save:               {idle_ms:8.2f} ms  (median of {len(idle)})")
    print(f"step, persist in flight:     {busy_ms:8.2f} ms  (median of {len(busy)}, "
          f"mean {statistics.mean(busy) * 1e3:.2f})")
    print(f"ratios: stall/floor = {stall_s / floor_s:.2f}x; torch.save/stall = "
          f"{sync_s / stall_s:.1f}x; step while persisting/step = {busy_ms / idle_ms:.2f}x")
    if not args.no_record:
        # The stall cannot go below one copy of the state (the floor); torch.save's own
        # multiple is context, as on a CPU-only machine it is bounded by that same copy.
        results.record("checkpoint: save() stall against the host-copy floor",
                       "<= 1.2x the floor",
                       f"{stall_s / floor_s:.2f}x ({stall_s * 1e3:.0f} ms for {state_mb:.0f} MB; "
                       f"torch.save {sync_s / stall_s:.1f}x the stall)",
                       stall_s / floor_s <= 1.2, results.command_line(sys.argv), host)


if __name__ == "__main__":
    main()
