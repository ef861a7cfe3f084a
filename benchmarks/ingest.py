"""Report ingest at scale: N simulated ranks on M nodes against a real launcher (issue 14).

No torch: each simulated node sends what its node reporter (jupyter_dlc/node/reporter.py)
sends, one batch of its ranks' reports every quarter second (a rank's reporter batches for
0.25 s), each rank logging `--rate` times a second (loss and samples_per_s, and the step breakdown
the runtime adds by default: step_ms, data_wait_ms, grad_sync_ms, ckpt_stall_ms;
`--no-breakdown` as with DLC_STEP_BREAKDOWN=0) and rank 0 of
each node adding a system sample every 5 s. Batches go through the real report route with
the job's own token (the job's script hands it over through a file), over keep-alive
connections from `--procs` client processes. The job's spec is the simulated world, so its
ranks table holds every rank and the launcher takes their reports (it refuses a rank outside
the job's world); the engine that runs it (`bench-one-rank`, engine_plugin/, registered by
an entry point) starts one process of it, as the local engine runs a 1x1 job. Every batch
updates real per-rank heartbeat rows and the detail read sorts every rank, as for a real job
of that size, which this machine cannot run.

While loaded, one reader polls as a view does: metrics since its last seq (past 8 ranks
folded per step into bands, jupyter_dlc/bands.py), the job list, the job's detail (one page
of 50 ranks, slowest first; with `--full-reads` every point and every rank instead), each
latency recorded. Printed per size: ingest p50/p99, accepted logs/s (a log is one rank's
step with its values, against what was offered), the batch interval the launcher's pace set
(`report_interval`, launcher/pacing.py; a node reporter keeps it), read p99s, the CPU of
the launcher, of its ingest worker and of the worker's retention analysis apart from the
benchmark's own (its simulated nodes and reader share the same cores) and the host's busy
share, database growth per minute. Latencies are of the steady load: the first WARMUP
seconds of each size, while the nodes start together at a quarter second and the launcher's
pace spreads them out, are printed apart (`start p99`).
The last line is the 4,096-rank steady ingest p99 against the 50 ms goal.

    python benchmarks/ingest.py [--sizes 64,1024,4096] [--per-node 8] [--seconds 30] [--full-reads]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import sys
import threading
import time

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The bench-one-rank engine, for the spec checked here and the launcher started from here.
PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_plugin")
sys.path.insert(0, PLUGIN)

import results as dashboard  # noqa: E402
from common import private_launcher, stop_launcher  # noqa: E402

from jupyter_dlc.hostprocs import child  # noqa: E402
from jupyter_dlc.node.reporter import MAX_PACE, paced, phase_shift  # noqa: E402

GOAL_MS = 50.0
READ_GOAL_MS = 100.0  # issue 14: every read of a view under 100 ms at 4,096 ranks
WARMUP = 3.0        # seconds of each size's load whose latencies are reported apart
BATCH_INTERVAL = 0.25
SYSTEM_EVERY = 5.0
JOB_SCRIPT = """
import os, time
path = os.path.join(os.environ["DLC_JOB_DIR"], "bench-token")
with open(path + ".tmp", "w") as f:
    f.write(os.environ["DLC_TOKEN"])
os.replace(path + ".tmp", path)
while not os.path.exists(os.path.join(os.environ["DLC_JOB_DIR"], "bench-done")):
    time.sleep(0.2)
"""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# -- the simulated nodes (client processes) ----------------------------------------------

def _breakdown(rate: float) -> dict[str, float]:
    """What the runtime adds to every `runtime.log` after the first (runtime/breakdown.py, on
    by default): the step's parts in ms, rounded to 1 us as it sends them."""
    step = 1000.0 / rate * random.uniform(0.95, 1.05)
    return {"step_ms": round(step, 3), "data_wait_ms": round(random.uniform(0.5, 2.0), 3),
            "grad_sync_ms": round(step * random.uniform(0.1, 0.2), 3), "ckpt_stall_ms": 0.0}


def node_body(node: int, ranks: range, attempt: int, step: int, rate: float, now: float,
              system: bool, interval: float = BATCH_INTERVAL, breakdown: bool = True) -> bytes:
    per_rank = rate * interval
    # 10 logs/s over 0.25 s: 2 or 3 entries, 2.5 on average.
    count = int(per_rank) + (1 if random.random() < per_rank - int(per_rank) else 0)
    reports = []
    for rank in ranks:
        metrics = [{"t": now, "step": step + i, "values": dict(
                       {"loss": 1.0 / (step + i + 1), "samples_per_s": 1000.0 + rank},
                       **(_breakdown(rate) if breakdown else {}))}
                   for i in range(count)]
        entry = {"rank": rank, "node": node, "attempt": attempt, "pid": 1000 + rank, "t": now,
                 "metrics": metrics, "system": [], "events": []}
        if system and rank == ranks[0]:
            entry["system"] = [{"t": now, "device": "cpu", "values": {"cpu_util": 0.5,
                                                                      "host_mem": 0.25}}]
        reports.append(entry)
    # orjson, as the ranks encode their reports (runtime/report.py: wirejson); a node
    # reporter splices their bodies into its batch without decoding them (node/reporter.py).
    # json.dumps here was the simulated nodes' largest cost, on the launcher's own cores.
    body = orjson.dumps({"node": node, "attempt": attempt, "t": now, "ranks": reports})
    return body, count * len(ranks)


async def run_node(host, port, path, token, node, ranks, attempt, rate, until, out, breakdown):
    reader, writer = await asyncio.open_connection(host, port)
    await asyncio.sleep(random.random() * BATCH_INTERVAL)  # nodes do not report in lockstep
    step, next_send, next_system = 0, time.monotonic(), time.monotonic()
    # As a node reporter does: a batch per quarter second, or at the launcher's pace.
    interval = BATCH_INTERVAL
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: token {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: ").encode()
    while time.monotonic() < until:
        now = time.monotonic()
        system = now >= next_system
        if system:
            next_system = now + SYSTEM_EVERY
        body, logs = node_body(node, ranks, attempt, step, rate, time.time(), system, interval, breakdown)
        step += int(rate * interval) + 1
        sent, start = time.monotonic(), time.perf_counter()
        writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        status_line = await reader.readline()
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        answer = await reader.readexactly(length)
        elapsed = (time.perf_counter() - start) * 1000
        ok = status_line.split()[1:2] == [b"200"]
        if not ok and not _refusal_said:
            _refusal_said.append(True)  # once a process: what the launcher said, to the console
            print(f"a batch refused: {status_line.decode(errors='replace').strip()} "
                  f"{answer[:300].decode(errors='replace')}", file=sys.stderr, flush=True)
        out.append((elapsed, ok, logs, interval, sent))
        shift = 0.0
        if ok:  # the launcher's pace, and the spread a node reporter takes when it grows
            pace = max(BATCH_INTERVAL, paced(json.loads(answer), MAX_PACE))
            shift, interval = phase_shift(interval, pace), pace
        next_send += interval + shift
        await asyncio.sleep(max(0.0, next_send - time.monotonic()))
    writer.close()


_refusal_said: list[bool] = []


def client_process(args: dict, nodes: list[int], queue) -> None:
    async def main():
        out: list = []
        until = args["start"] + args["seconds"]
        await asyncio.sleep(max(0.0, args["start"] - time.monotonic()))
        tasks = [run_node(args["host"], args["port"], args["path"], args["token"], node,
                          range(node * args["per_node"], (node + 1) * args["per_node"]),
                          args["attempt"], args["rate"], until, out, args["breakdown"]) for node in nodes]
        await asyncio.gather(*tasks)
        return out

    queue.put(asyncio.run(main()))


# -- the reader and the launcher's own numbers -------------------------------------------

def reader_thread(client, job_id: str, until: float, reads: dict, as_a_view: bool) -> None:
    cursor = {"since": client.metrics(job_id)["last_seq"]}
    # A view past 8 ranks reads train points folded per step (jupyter_dlc/bands.py) and one
    # page of the rank table, slowest first; --full-reads: every point and every rank.
    calls = {"metrics": lambda: client.metrics(job_id, cursor["since"], band=() if as_a_view else None),
             "list": lambda: client.request("GET", "/api/jobs"),
             "detail": lambda: (client.job(job_id, rank_sort="step", rank_page=0) if as_a_view
                                else client.job(job_id))}
    while time.monotonic() < until:
        for kind, call in calls.items():
            sent, start = time.monotonic(), time.perf_counter()
            answer = call()
            reads[kind].append(((time.perf_counter() - start) * 1000, sent))
            if kind == "metrics":
                cursor["since"] = answer["last_seq"]
        time.sleep(BATCH_INTERVAL)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_jiffies() -> tuple[int, int]:
    """(busy, all) clock ticks of every core since boot, from /proc/stat: what the host's
    cores did while the load ran, whoever ran it."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks[:8]) - idle, sum(ticks[:8])


def db_bytes(data_dir: str) -> int:
    base = os.path.join(data_dir, "launcher.sqlite")
    return sum(os.path.getsize(p) for p in (base, base + "-wal") if os.path.exists(p))


def run_size(client, script: str, data_dir: str, ranks: int, per_node: int, rate: float,
             seconds: float, procs: int, as_a_view: bool = True, breakdown: bool = True) -> dict:

    nodes = max(1, ranks // per_node)
    # The spec names the simulated world, so that the launcher takes every simulated rank's
    # report (it refuses a rank outside the job's world) and sizes the ranks table by it;
    # the bench-one-rank engine (engine_plugin/) runs one process of it.
    # No restarts: a job that may restart gets standby agents for its next attempt once it
    # trains (launcher/judging.py), and those import torch and fork warm ranks. A real job's
    # run on its own nodes; here they would run on the launcher's two cores during the load
    # (a quarter of a core over a 15 s load, 2026-12-06).
    job = client.submit({"script": script, "name": f"ingest-{ranks}", "engine": "bench-one-rank",
                         "nodes": nodes, "nproc_per_node": per_node, "max_restarts": 0})
    token_path = os.path.join(job["job_dir"], "bench-token")
    deadline = time.monotonic() + 120
    while not os.path.exists(token_path):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job['id']} did not start: {client.job(job['id'])['reason']}")
        time.sleep(0.2)
    with open(token_path) as f:
        token = f.read()
    attempt = client.job(job["id"])["attempt"]
    health = client.request("GET", "/healthz")[1]
    pid, ingest_pid = health["pid"], health["ingest"]["pid"]
    # The worker's retention analysis runs in a process of its own (retention_process.py).
    deadline = time.monotonic() + 30
    while (analysis_pid := child(ingest_pid, b"retention_process")) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the ingest worker has no retention analysis process")
        time.sleep(0.1)
    host, port = client.url.split("//")[1].split(":")
    start = time.monotonic() + 1.0
    args = {"host": host, "port": int(port), "path": f"/api/jobs/{job['id']}/report",
            "token": token, "attempt": attempt, "rate": rate, "per_node": per_node,
            "start": start, "seconds": seconds, "breakdown": breakdown}
    queue = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=client_process,
                                       args=(args, list(range(i, nodes, procs)), queue))
               for i in range(min(procs, nodes))]
    for worker in workers:
        worker.start()
    reads: dict[str, list[tuple[float, float]]] = {"metrics": [], "list": [], "detail": []}
    while time.monotonic() < start:
        time.sleep(0.01)
    cpu0, db0, t0 = cpu_seconds(pid), db_bytes(data_dir), time.monotonic()
    ingest0, own0, host0 = cpu_seconds(ingest_pid), cpu_seconds(os.getpid()), host_jiffies()
    analysis0 = cpu_seconds(analysis_pid)
    senders0 = sum(cpu_seconds(worker.pid) for worker in workers)
    reader = threading.Thread(target=reader_thread,
                              args=(client, job["id"], start + seconds, reads, as_a_view))
    reader.start()
    results = [r for _ in workers for r in queue.get()]
    reader.join()
    cpu1, db1, t1 = cpu_seconds(pid), db_bytes(data_dir), time.monotonic()
    ingest1, own1, host1 = cpu_seconds(ingest_pid), cpu_seconds(os.getpid()), host_jiffies()
    analysis1 = cpu_seconds(analysis_pid)
    senders1 = sum(cpu_seconds(worker.pid) for worker in workers)  # exited, not yet joined: still read
    for worker in workers:
        worker.join()
    open(os.path.join(job["job_dir"], "bench-done"), "w").close()
    client.wait(job["id"], timeout=60)
    steady = start + WARMUP
    latencies = [ms for ms, ok, _, _, sent in results if ok and sent >= steady]
    warmup = [ms for ms, ok, _, _, sent in results if ok and sent < steady]
    accepted = sum(n for _, ok, n, _, _ in results if ok)
    failed = sum(1 for _, ok, _, _, _ in results if not ok)
    pace = percentile([interval for _, _, _, interval, sent in results if sent >= steady], 50)
    wall = t1 - t0
    return {"ranks": ranks, "nodes": nodes, "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99), "start_p99": percentile(warmup, 99), "accepted": accepted / seconds,
            "offered": ranks * rate, "pace": pace, "batches": len(results), "failed": failed,
            "reads": {k: percentile([ms for ms, sent in v if sent >= steady], 99) for k, v in reads.items()},
            "read_counts": {k: len(v) for k, v in reads.items()},
            "cpu": (cpu1 - cpu0) / wall, "ingest_cpu": (ingest1 - ingest0) / wall,
            "analysis_cpu": (analysis1 - analysis0) / wall,
            # What the benchmark itself costs on the same cores, over the same window: its
            # simulated nodes (the client processes) and this process (the reader thread).
            "senders_cpu": (senders1 - senders0) / wall, "reader_cpu": (own1 - own0) / wall,
            "host_busy": (host1[0] - host0[0]) / max(1, host1[1] - host0[1]) * (os.cpu_count() or 1),
            "db_mb_min": (db1 - db0) / wall * 60 / 1e6,
            "db_mb": db1 / 1e6}


def cpu_shares(r: dict) -> str:
    """Who used the host's cores during the load: the product (launcher, ingest worker and
    its retention analysis) apart from the benchmark that loads it (simulated nodes, reader),
    which shares the cores."""
    others = r["host_busy"] - r["cpu"] - r["ingest_cpu"] - r["analysis_cpu"] - r["senders_cpu"] - \
        r["reader_cpu"]
    return (f"CPU launcher {r['cpu'] * 100:.0f}% + ingest worker {r['ingest_cpu'] * 100:.0f}% "
            f"+ retention analysis {r['analysis_cpu'] * 100:.0f}% (the product), "
            f"the benchmark's simulated nodes {r['senders_cpu'] * 100:.0f}% + "
            f"reader {r['reader_cpu'] * 100:.0f}%, the rest of the host {max(0.0, others) * 100:.0f}%: "
            f"{r['host_busy'] * 100:.0f}% of {(os.cpu_count() or 1) * 100}% busy")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,1024,4096")
    parser.add_argument("--per-node", type=int, default=8, help="ranks per node")
    parser.add_argument("--rate", type=float, default=10.0, help="logs a second per rank")
    parser.add_argument("--seconds", type=float, default=30.0, help="load per size")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--full-reads", action="store_true",
                        help="the reader reads every point and every rank, not bands and a page")
    parser.add_argument("--no-breakdown", action="store_true",
                        help="ranks send no step breakdown, as with DLC_STEP_BREAKDOWN=0")
    parser.add_argument("--metrics-cap", type=int, default=None,
                        help="the launcher's DLC_METRICS_CAP (points per job)")
    dashboard.add_argument(parser)
    args = parser.parse_args()
    host = dashboard.Host.now()
    if args.metrics_cap:
        os.environ["DLC_METRICS_CAP"] = str(args.metrics_cap)
    # The launcher it starts finds the bench-one-rank engine by its entry point there.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (PLUGIN, os.environ.get("PYTHONPATH")) if p)
    client, root, script = private_launcher("dlc-ingest-", "job.py", JOB_SCRIPT)
    data_dir = os.environ["DLC_DATA_DIR"]
    print(f"host at start: {host}; "
          f"{args.per_node} ranks a node, {args.rate:g} logs/s a rank, {args.seconds:g} s a size",
          flush=True)
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            r = run_size(client, script, data_dir, size, args.per_node, args.rate,
                         args.seconds, args.procs, as_a_view=not args.full_reads,
                         breakdown=not args.no_breakdown)
            results.append(r)
            print(f"{r['ranks']:>5} ranks / {r['nodes']:>4} nodes: ingest p50 {r['p50']:.1f} ms "
                  f"p99 {r['p99']:.1f} ms (start p99 {r['start_p99']:.0f} ms), {r['accepted']:.0f} logs/s accepted "
                  f"(offered {r['offered']:.0f}), a batch every {r['pace']:.2f} s a node, "
                  f"{r['failed']} failed batches; read p99 "
                  f"metrics {r['reads']['metrics']:.0f} ms, list {r['reads']['list']:.0f} ms, "
                  f"detail {r['reads']['detail']:.0f} ms ({sum(r['read_counts'].values())} reads);"
                  f" {cpu_shares(r)}; DB +{r['db_mb_min']:.1f} MB/min "
                  f"({r['db_mb']:.0f} MB); load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        stop_launcher(client, root)
    last = results[-1]
    print(f"{last['ranks']}-rank steady ingest p99 {last['p99']:.1f} ms vs goal {GOAL_MS:g} ms: ratio "
          f"{last['p99'] / GOAL_MS:.2f} ({'met' if last['p99'] < GOAL_MS else 'not met'})")
    if not args.no_record:
        reads = last["reads"]
        dashboard.record(f"{last['ranks']} ranks: ingest p99, reads p99 (metrics / list / detail)",
                         f"ingest < {GOAL_MS:g} ms, reads < {READ_GOAL_MS:g} ms",
                         f"ingest {last['p99']:.1f} ms; reads {reads['metrics']:.0f} / "
                         f"{reads['list']:.0f} / {reads['detail']:.0f} ms",
                         last["p99"] < GOAL_MS and max(reads.values()) < READ_GOAL_MS,
                         dashboard.command_line(sys.argv), host)


if __name__ == "__main__":
    main()
