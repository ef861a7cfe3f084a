"""Step time of a training loop with runtime.log() every step and heartbeats on, against the
same loop bare. The launcher is a real HTTP server in another process (stdlib http.server),
as in a job. Blocks of bare and logged steps alternate, so drift in machine load hits both.

    python benchmarks/telemetry.py [--blocks 10] [--steps 100]
"""

import argparse
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


def training_step(a, b):
    """About 8-10 ms on one thread, like the small model of FIELD-NOTES."""
    for _ in range(4):
        a = torch.tanh(a @ b)
    return a


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    results.add_argument(parser)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    port = free_port()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(port)])
    os.environ.update(DLC_LAUNCHER_URL=f"http://127.0.0.1:{port}", DLC_JOB_ID="bench",
                      DLC_TOKEN="t", DLC_HEARTBEAT_INTERVAL="0.5")
    sys.path.insert(0, REPO)
    from jupyter_dlc import runtime

    torch.set_num_threads(1)
    a, b = torch.randn(256, 512), torch.randn(512, 512) / 24
    try:
        runtime.log(0, loss=1.0)  # starts the reporter and the system sampler
        bare, logged = [], []
        step = 0
        for _ in range(args.blocks):
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = training_step(a, b).mean().item()
            bare.append((time.perf_counter() - start) / args.steps)
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = training_step(a, b).mean().item()
                step += 1
                runtime.log(step, loss=loss, lr=0.1, samples_per_s=1000.0)
            logged.append((time.perf_counter() - start) / args.steps)
        delivered = runtime.get_reporter().flush(10)
    finally:
        launcher.kill()
    bare_ms, logged_ms = statistics.median(bare) * 1e3, statistics.median(logged) * 1e3
    reporter = runtime.get_reporter()
    print(f"{args.blocks} blocks x {args.steps} steps each way, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"bare step:   {bare_ms:.3f} ms (median of block means)")
    print(f"logged step: {logged_ms:.3f} ms; {reporter.reports_sent} reports sent, "
          f"dropped {reporter.dropped}, all delivered: {delivered}")
    print(f"ratio logged/bare = {logged_ms / bare_ms:.3f}x")
    if not args.no_record:
        results.record("telemetry: a logged step against a bare one", "<= 1.01x",
                       f"{logged_ms / bare_ms:.3f}x ({bare_ms:.2f} ms bare)",
                       logged_ms / bare_ms <= 1.01, results.command_line(sys.argv), load)


if __name__ == "__main__":
    main()
