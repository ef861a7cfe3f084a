"""Step time of a training loop with runtime.log() every step and heartbeats on, against the
same loop bare. The launcher is a real HTTP server in another process (stdlib http.server,
keeping connections as the launcher does), as in a job. Blocks of steps alternate, each
round in the next of the six orders, so drift in machine load hits every arm alike; each
ratio is the median over rounds of that round's ratio (one round's blocks run within a
second of each other: a 2-core machine's load swings more than 1% from one second to the
next, which a median of whole-run block means left in).

Each step draws a batch from a torch DataLoader and runs forward and backward of a DDP model
(gloo, a world of one): 9.5 ms on this kind of machine on 2026-12-01, 3.0-3.4 ms on
2026-12-05 (the step is fixed work, not a fixed time; the printed bare step says which, and a
shorter step makes the same per-step cost a larger ratio). Three arms:
- bare: no runtime at all (the DataLoader and DDP as torch has them);
- logged: runtime.log() every step with the step breakdown off (DLC_STEP_BREAKDOWN=0);
- breakdown: runtime.log() with the breakdown on: the DataLoader's __next__ timed through
  the shim, the DDP's gradient sync timed as a DDP built after runtime.init() is, and the
  four breakdown values added to every log().
All three arms run the same model and the same DataLoader iterator (two instances of one
model differ by up to 1% here, by where their memory lies).
The last line is the ratio breakdown/bare (target <= 1.01x).

    python benchmarks/telemetry.py [--blocks 480] [--steps 25]

480 rounds of 25-step blocks (about 80 s): with 30 rounds of 100 steps the same code gave
ratios 0.5-1% apart from run to run, with 120 rounds of 50 steps 3% in the slower hours of
2026-12-06 (0.985-1.018x, three runs within five minutes); in shorter rounds each arm's
block runs within 0.1 s of the others (three runs 1.013-1.017x within six minutes, six
recorded ones 0.998-1.012x over an hour).

The loop keeps a core busy, so its reports come every 0.5 s (runtime/report.py,
BUSY_BATCH_INTERVAL) rather than every 0.1 s; `DLC_REPORT_INTERVAL=0.1` measures the short
interval for comparison.
"""

import argparse
import itertools
import os
import socket
import statistics
import subprocess
import sys
import time

import results
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the connection kept, as the launcher and node reporter keep it
    disable_nagle_algorithm = True  # as the node reporter: its answer's body is not held for an ACK
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"ok": True, "commands": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OneBatch(torch.utils.data.Dataset):
    """The same batch, endlessly: the loader's own cost, not a dataset's."""

    def __init__(self, batch):
        self.batch = batch

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return self.batch


def network():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[layer for _ in range(3) for layer in
                                 (torch.nn.Linear(512, 512), torch.nn.Tanh())])


def training_step(model, batches):
    """One step of fixed work (module docstring), on one thread."""
    loss = model(next(batches)).mean()
    loss.backward()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=480)
    parser.add_argument("--steps", type=int, default=25)
    results.add_argument(parser)
    args = parser.parse_args()
    host = results.Host.now()
    print(f"host at start: {host}", flush=True)
    port = free_port()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(port)])
    os.environ.update(DLC_LAUNCHER_URL=f"http://127.0.0.1:{port}", DLC_JOB_ID="bench",
                      DLC_TOKEN="t", DLC_HEARTBEAT_INTERVAL="0.5")
    sys.path.insert(0, REPO)
    from jupyter_dlc import runtime

    from jupyter_dlc.runtime import breakdown
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    runtime.init()  # a gloo group of one
    breakdown.switch(False)
    # One model and one iterator for every arm: two instances of the same model differ by
    # up to 1% in step time on this machine (where their memory lies), which would be
    # measured as the telemetry's. The breakdown arm times this DDP with the very hook a DDP
    # built after runtime.init() gets (breakdown.time_ddp), removed again after its block;
    # the DataLoader shim is on the iterator's class, installed and removed with switch().
    model = DDP(network())
    batches = iter(torch.utils.data.DataLoader(OneBatch(torch.randn(48, 512)), batch_size=None))
    arms = {"bare": [], "logged": [], "breakdown": []}
    try:
        runtime.log(0, loss=1.0)  # starts the reporter and the system sampler
        for _ in range(20):  # DDP rebuilds its buckets after its first iteration
            training_step(model, batches)
        step = 0
        orders = list(itertools.permutations(arms))  # each arm after each other as often
        for block in range(args.blocks):
            for arm in orders[block % len(orders)]:
                times = arms[arm]
                on = arm == "breakdown"
                breakdown.switch(on)
                timing = breakdown.time_ddp(model) if on else None
                start = time.perf_counter()
                for _ in range(args.steps):
                    loss = training_step(model, batches)
                    if arm != "bare":
                        step += 1
                        runtime.log(step, loss=loss, lr=0.1, samples_per_s=1000.0)
                times.append((time.perf_counter() - start) / args.steps)
                if timing is not None:
                    timing.remove()
        delivered = runtime.get_reporter().flush(10)
    finally:
        launcher.kill()
    bare_ms, logged_ms, breakdown_ms = (statistics.median(arms[a]) * 1e3 for a in arms)

    def ratio(arm, to):
        return statistics.median(a / b for a, b in zip(arms[arm], arms[to], strict=True))

    logged, on, on_logged = ratio("logged", "bare"), ratio("breakdown", "bare"), ratio("breakdown", "logged")
    reporter = runtime.get_reporter()
    print(f"{args.blocks} rounds of {args.steps} steps each way, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"bare step:      {bare_ms:.3f} ms (median of block means)")
    print(f"logged step:    {logged_ms:.3f} ms (breakdown off); {reporter.reports_sent} reports "
          f"sent, dropped {reporter.dropped}, all delivered: {delivered}")
    print(f"breakdown step: {breakdown_ms:.3f} ms (breakdown on)")
    print(f"ratio logged/bare = {logged:.3f}x, breakdown/logged = {on_logged:.3f}x "
          "(medians of each round's ratio)")
    print(f"ratio breakdown/bare = {on:.3f}x")
    if not args.no_record:
        end = results.cpu_probe()  # one run, one host at its end for both rows
        results.record("telemetry: a logged step against a bare one", "<= 1.01x",
                       f"{logged:.3f}x ({bare_ms:.2f} ms bare)",
                       logged <= 1.01, results.command_line(sys.argv), host, end_probe=end)
        results.record("step breakdown: a step with the breakdown on against a bare one",
                       "<= 1.01x", f"{on:.3f}x ({bare_ms:.2f} ms bare)",
                       on <= 1.01, results.command_line(sys.argv), host, end_probe=end)


if __name__ == "__main__":
    main()
