"""Report and list latency while a Slurm submit is held in sbatch (issue 21).

A real local Slurm cluster (scripts/local-slurm.sh, its own state dir and ports) and a
private launcher whose `sbatch` is a wrapper that holds the first submit until released
(tests/test_event_loop.py's HeldSbatch). 64 simulated ranks (8 node batches every quarter
second, tests/test_event_loop.py's RankLoad) report to an ended job of their world (one
that started no process: tests/test_ingest.py's ended_world), and a reader
lists the jobs ten times a second. Two windows of `--seconds` each: without a held submit,
then with one held and a stop of that job posted (which, when the launcher's loop waited on
the job's start, stalled every report until the sbatch returned). Printed: report and
list p50/p99 in each window, and the held/free ratio of each p99; the last line, the held
window's p99s against the issue's goals (reports under 50 ms, the list under 100 ms).

    python benchmarks/held_submit.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import results  # noqa: E402
from conftest import LauncherEnv  # noqa: E402
from test_event_loop import PER_NODE, RANKS, HeldSbatch, Lister, RankLoad, held_submit, percentile  # noqa: E402
from test_ingest import ended_world  # noqa: E402
from test_slurm import local_slurm  # noqa: E402

REPORT_GOAL_MS, LIST_GOAL_MS = 50.0, 100.0
SLURM_PORT = "17617"  # not the tests' 16917 / 17517


def window(client, target: str, seconds: float) -> tuple[list, list]:
    """Reports and lists for `seconds` (a measuring window, so a timed one)."""
    load, lister = RankLoad(client, target), Lister(client)
    load.start()
    lister.thread.start()
    time.sleep(seconds)
    load.stop()
    lister.done.set()
    lister.thread.join()
    failed = [s for s, _ in load.results + lister.results if s != 200]
    if failed:
        raise SystemExit(f"{len(failed)} answers were not 200: {sorted(set(failed))}")
    return load.results, lister.results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="each window (the held one stays under sbatch's 30 s timeout)")
    results.add_argument(parser)
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="dlc-held-"))
    host = results.Host.now()
    print(f"host at start: {host}", flush=True)
    try:
        with local_slurm(root / "slurm", SLURM_PORT) as slurm:
            hold = HeldSbatch(root / "hold", shutil.which("sbatch", path=slurm["PATH"]))
            os.environ["PATH"] = hold.dir + os.pathsep + os.environ["PATH"]
            launcher = LauncherEnv(str(root / "launcher"))
            try:
                # An ended job of the simulated ranks' world: the launcher refuses (400) a
                # report of a rank outside the job's world (since 2026-12-01 17:01).
                with pytest.MonkeyPatch.context() as env:  # the launcher keeps what it started with
                    target = ended_world(launcher, env, RANKS // PER_NODE, PER_NODE)["id"]
                free = window(launcher.client, target, args.seconds)
                slow = held_submit(launcher, hold)
                launcher.client.request("POST", f"/api/jobs/{slow['id']}/stop", body={})
                held = window(launcher.client, target, args.seconds)
                assert hold.held(), "the submit was not held through the window"
                hold.release()
                launcher.client.wait(slow["id"], timeout=120)
            finally:
                hold.close()
                launcher.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, index in (("reports", 0), ("job list", 1)):
        a, b = free[index], held[index]
        print(f"{name}: free p50 {percentile(a, 50):.1f} p99 {percentile(a, 99):.1f} ms ({len(a)}); "
              f"held p50 {percentile(b, 50):.1f} p99 {percentile(b, 99):.1f} ms ({len(b)}); "
              f"p99 ratio held/free {percentile(b, 99) / percentile(a, 99):.2f}")
    reports, lists = percentile(held[0], 99), percentile(held[1], 99)
    print(f"while a submit is held: report p99 {reports:.1f} ms vs goal {REPORT_GOAL_MS:g} ms "
          f"(ratio {reports / REPORT_GOAL_MS:.2f}), list p99 {lists:.1f} ms vs goal {LIST_GOAL_MS:g} ms "
          f"(ratio {lists / LIST_GOAL_MS:.2f}); load {os.getloadavg()[0]:.1f}")
    if not args.no_record:
        results.record("reports and the job list while a Slurm submit is held, 64 ranks",
                       f"report p99 < {REPORT_GOAL_MS:g} ms, list p99 < {LIST_GOAL_MS:g} ms",
                       f"report p99 {reports:.1f} ms, list p99 {lists:.1f} ms",
                       reports < REPORT_GOAL_MS and lists < LIST_GOAL_MS,
                       results.command_line(sys.argv), host)


if __name__ == "__main__":
    main()
