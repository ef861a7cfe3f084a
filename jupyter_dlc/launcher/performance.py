"""The performance verdict `why` gives a job that did not fail (running or ended).

From the step breakdown of each rank's last WINDOW_STEPS steps (the runtime's `step_ms`,
`data_wait_ms`, `grad_sync_ms`, `ckpt_stall_ms`, summed over every rank):

- straggler: the detector (stragglers.py) names a rank or node over those steps; first,
  since one slow rank makes every other rank's all-reduce wait look like communication;
- input-bound: data wait is at least INPUT_SHARE of step time;
- communication-bound: gradient sync is at least COMM_SHARE of step time;
- checkpoint-bound: checkpoint stall is at least CKPT_SHARE of step time;
- healthy: none of these; compute is the rest.

Where several shares pass their bound, the one furthest past it wins. Each verdict carries
its figures (mean ms per step and shares) and a suggestion.
"""

from __future__ import annotations

from typing import Any

from .stragglers import BREAKDOWN, StragglerDetector

WINDOW_STEPS = 100
READ_POINTS = 400_000  # at most this many of the newest points are read for a verdict
INPUT_SHARE = 0.25
COMM_SHARE = 0.30
CKPT_SHARE = 0.10

SUGGESTIONS = {
    "input-bound": "feed the loop faster: more DataLoader workers (num_workers), pin_memory=True "
                   "with non_blocking copies, persistent_workers and a larger prefetch_factor; "
                   "decode and augment in the workers, not in the loop",
    "communication-bound": "all-reduce less or overlap it: a larger DDP bucket_cap_mb, gradient "
                           "compression (a DDP comm hook: bf16/fp16 compress or PowerSGD), or "
                           "gradient accumulation with no_sync() between all-reduces",
    "checkpoint-bound": "checkpoint less often (a longer interval), or save asynchronously "
                        "(torch.distributed.checkpoint.async_save) so the loop does not wait",
    "straggler": "look at that rank's node: its data pipeline (input-bound) or its device "
                 "(compute-bound: throttling, a noisy neighbour); exclude the node or rebalance",
    "healthy": "nothing stands out: most of each step is compute",
}


def verdict(points: list[tuple[str, float, int, float]], world: int, nproc: int) -> dict[str, Any] | None:
    """The verdict over points (name, t, rank, value) of the breakdown names; None when the
    job logged no breakdown."""
    times: dict[int, list[float]] = {}  # rank -> times of its steps
    for name, t, rank, value in points:
        if name == "step_ms" and value is not None:
            times.setdefault(rank, []).append(t)
    if not times:
        return None
    since = {rank: sorted(ts)[-WINDOW_STEPS] if len(ts) >= WINDOW_STEPS else -1e300
             for rank, ts in times.items()}
    window = [p for p in points if p[3] is not None and p[2] in since and p[1] >= since[p[2]]]
    totals = dict.fromkeys(BREAKDOWN, 0.0)
    for name, _t, _rank, value in window:
        totals[name] += float(value)
    count = sum(1 for p in window if p[0] == "step_ms")
    step = totals["step_ms"] or 1e-9
    shares = {"data_wait": totals["data_wait_ms"] / step, "grad_sync": totals["grad_sync_ms"] / step,
              "ckpt_stall": totals["ckpt_stall_ms"] / step}
    shares["compute"] = max(0.0, 1 - sum(shares.values()))
    means = {name: totals[name] / count for name in BREAKDOWN}
    means["compute_ms"] = max(0.0, means["step_ms"] - means["data_wait_ms"] - means["grad_sync_ms"]
                              - means["ckpt_stall_ms"])
    detector = StragglerDetector(world, nproc)
    detector.add(window)
    stragglers = detector.judge()
    figures = {"steps": count,
               **{k: round(v, 3) for k, v in means.items()},
               "shares": {k: round(v, 4) for k, v in shares.items()}}
    pct = {k: f"{100 * v:.0f}%" for k, v in shares.items()}
    head = (f"over the last {count} rank-steps: a step takes {means['step_ms']:.1f} ms, "
            f"data wait {pct['data_wait']}, gradient sync {pct['grad_sync']}, "
            f"checkpoint stall {pct['ckpt_stall']}, compute {pct['compute']}")
    if stragglers:
        kind, line = "straggler", f"{stragglers[0]['message']} ({head})"
    else:
        past = [(share / bound, name) for share, bound, name in (
            (shares["data_wait"], INPUT_SHARE, "input-bound"),
            (shares["grad_sync"], COMM_SHARE, "communication-bound"),
            (shares["ckpt_stall"], CKPT_SHARE, "checkpoint-bound")) if share >= bound]
        kind = max(past)[1] if past else "healthy"
        line = head
    return {"verdict": kind, "line": line, "suggestion": SUGGESTIONS[kind], "figures": figures,
            "stragglers": stragglers}
