"""Storing metric points (issue 14): CPU per second of 4,096-rank load.

The load: 4,096 ranks in node batches of 8 (as the node reporter sends them), each rank 4
reports a second of 2-3 entries x 2 values (10 logs a second: 81,920 points a second), stored
64 requests to a commit, as the ingest writer does. Measured in this process, CPU time:

- baseline: the same points as one SQLite row each, in the one-row-per-point `metrics` table
  the store used before chunks (a 10-tuple per point, one executemany per commit);
- chunks: `Store.record_reports` (one chunk per request, kind and device), minus what the same
  reports (their steps, no values) cost it without points: heartbeats, steps;
- retention: after `--warm` seconds of load, the analysis (its own thread in the launcher)
  and the chunk rewrites (on the writer) per second of the next `--seconds` of load, a pass
  every 10 s of load, keep_last and recent_steps `--keep`.

`python benchmarks/metric_store.py` prints the chunks/rows ratio of storing last.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import results  # noqa: E402
from jupyter_dlc.launcher.retention import Retention, RetentionPolicy  # noqa: E402
from jupyter_dlc.launcher.store import Store  # noqa: E402

T0 = 1.8e9
OLD_TABLE = """
CREATE TABLE metrics (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, t REAL NOT NULL,
    attempt INTEGER, rank INTEGER, node INTEGER, step INTEGER, kind TEXT NOT NULL,
    name TEXT NOT NULL, value REAL, device TEXT);
CREATE INDEX metrics_job ON metrics (job_id, seq);
"""


def one_second(ranks: int, second: int, steps: list[int]) -> list[list]:
    """The commits of one second of load: lists of (job, attempt, node batch) requests."""
    commits = []
    for quarter in range(4):
        t = T0 + second + quarter / 4
        reports = []
        for rank in range(ranks):
            count = 2 + (random.random() < 0.5)
            reports.append({"rank": rank, "node": rank // 8, "attempt": 1, "t": t, "metrics": [
                {"t": t, "step": steps[rank] + i,
                 "values": {"loss": 1.0 / (steps[rank] + i + 1) + random.random() * 0.01,
                            "samples_per_s": 1000.0 + random.random()}} for i in range(count)]})
            steps[rank] += count
        requests = [("j", 1, reports[i:i + 8]) for i in range(0, ranks, 8)]
        commits += [requests[i:i + 64] for i in range(0, len(requests), 64)]
    return commits


def rows_baseline(path: str, commits: list[list]) -> float:
    """CPU seconds to store the points one row each, as the store did before chunks."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(OLD_TABLE)
    start = time.process_time()
    for commit in commits:
        rows = []
        for job_id, attempt, reports in commit:
            for report in reports:
                rank, node = report["rank"], report.get("node")
                for entry in report["metrics"]:
                    t, step = float(entry["t"]), entry.get("step")
                    for name, value in entry["values"].items():
                        rows.append((job_id, t, attempt, rank, node, step, "train", str(name),
                                     float(value), None))
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO metrics (job_id, t, attempt, rank, node, step, kind, name,"
                       " value, device) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
    return time.process_time() - start


def new_store(path: str, ranks: int) -> Store:
    store = Store(path)
    store.insert_job("j", "bench", {"script": "x"}, "token", os.path.dirname(path))
    store.init_ranks("j", 1, ranks // 8, 8)
    return store


def store_cpu(store: Store, commits: list[list]) -> float:
    start = time.process_time()
    for commit in commits:
        store.record_reports(commit)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3, help="seconds of load stored each way")
    parser.add_argument("--warm", type=int, default=30, help="seconds of load before retention is measured")
    parser.add_argument("--seconds", type=int, default=30, help="seconds of load retention is measured over")
    parser.add_argument("--keep", type=int, default=100, help="keep_last and recent_steps")
    results.add_argument(parser)
    args = parser.parse_args()
    host = results.Host.now()
    print(f"host at start: {host}", flush=True)
    random.seed(1)
    work = tempfile.mkdtemp(prefix="dlc-bench-")
    steps = [0] * args.ranks
    rows_s, chunk_s = [], []
    store = new_store(os.path.join(work, "chunks.sqlite"), args.ranks)
    bare_store = new_store(os.path.join(work, "bare.sqlite"), args.ranks)
    for rep in range(args.reps):  # alternate, on the same reports
        commits = one_second(args.ranks, rep, steps)
        # The same reports with their steps but no values: what the store does besides points.
        bare = [[(job, attempt, [dict(r, metrics=[{"t": e["t"], "step": e["step"]} for e in r["metrics"]])
                                 for r in reports]) for job, attempt, reports in c] for c in commits]
        rows_s.append(rows_baseline(os.path.join(work, f"rows{rep}.sqlite"), commits))
        chunk_s.append(store_cpu(store, commits) - store_cpu(bare_store, bare))
    rows_cpu, chunk_cpu = min(rows_s), min(chunk_s)
    print(f"storing one second of {args.ranks}-rank load ({args.ranks * 20} points): "
          f"rows {rows_cpu:.3f} s CPU, chunks {chunk_cpu:.3f} s CPU (best of {args.reps})")

    if args.seconds:
        retention = Retention(store, RetentionPolicy(keep_last=args.keep, recent_steps=args.keep,
                                                     max_points=10**12))
        analysis = writer = 0.0
        for second in range(args.reps, args.reps + args.warm + args.seconds):
            store_cpu(store, one_second(args.ranks, second, steps))
            if second % 10 != 9:
                continue
            start = time.process_time()
            retention._analyze_all()
            analyzed = time.process_time() - start
            start = time.process_time()
            while retention._removals:
                retention.run_slices(budget=3600)
            rewritten = time.process_time() - start
            if second >= args.reps + args.warm:
                analysis += analyzed
                writer += rewritten
        print(f"retention per second of load (keep_last {args.keep}, 1 s buckets): analysis "
              f"{analysis / args.seconds:.3f} s CPU, chunk rewrites on the writer "
              f"{writer / args.seconds:.3f} s CPU; points removed so far "
              f"{store.retention_state('j')['dropped']}")
    print(f"chunks/rows CPU of storing points: {chunk_cpu / rows_cpu:.3f}")
    if not args.no_record:
        results.record(f"metric storage: chunks against a row per point, {args.ranks} ranks",
                       "< 1.0x rows' CPU", f"{chunk_cpu / rows_cpu:.3f}x rows' CPU",
                       chunk_cpu < rows_cpu, results.command_line(sys.argv), host)


if __name__ == "__main__":
    main()
