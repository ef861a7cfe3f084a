"""The band of a train metric past MAX_RANK_LINES ranks, folded where the points are read.

A view of 4,096 ranks logging every step at 10 steps/s gets 40,000 points a second per
metric, and draws them as one mean with a min-max band plus at most MAX_OUTLIERS ranks that
stand out. Reading every point into the view cost the launcher most of a metrics read
(benchmarks/HISTORY.md). So a view past MAX_RANK_LINES ranks asks for `band=1`: the
launcher folds the train points it reads into one row per (attempt, name, step), with the
count, sum, min and max of the values it read and the ranks that stand out among them, and
sends as points only those of the ranks the view names (`ranks=`, its outlier lines).

Rows are mergeable: a step whose ranks' points are stored across several reads comes as
several rows, which the view adds up (`widgets/series.py` TrainData, the panel's
`labextension/src/charts.ts` BandSeries). Outliers are judged within a row's values, by
`outlier_ranks`; a row of fewer than MIN_GROUP values names none (in a handful of values
that mostly agree, any difference reads as far), so a rank that stands out for one step
while its values come in small reads may go unnamed. With node reporters a read holds whole
nodes' batches, and a rank that keeps diverging is named at a later step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

MAX_RANK_LINES = 8
MAX_OUTLIERS = 3
MIN_GROUP = 8


def outlier_ranks(values: dict[int, float], limit: int = MAX_OUTLIERS) -> list[int]:
    """The ranks whose value at one step lies far from the others: more than 5 scaled
    median absolute deviations from the median (every differing rank when all others
    agree), farthest first, at most `limit`. Robust to the outliers themselves, unlike a
    mean and standard deviation, which one wild rank of eight drags along. The median is
    the middle value (the upper one of an even count), as in the panel's charts.ts."""
    if len(values) < 3:
        return []
    # numpy: a launcher folding 4,096 ranks judges 20 steps a second per metric
    vals = np.fromiter(values.values(), float, len(values))
    middle = len(vals) // 2
    median = np.partition(vals, middle)[middle]
    deviations = np.abs(vals - median)
    mad = np.partition(deviations, middle)[middle] * 1.4826
    bound = 5 * mad if mad > 0 else 1e-12 * max(1.0, abs(median))
    far = np.flatnonzero(deviations > bound)
    if not len(far):
        return []
    ranks = list(values)
    ordered = sorted(((deviations[i], ranks[i]) for i in far), reverse=True)
    return [int(rank) for _, rank in ordered[:limit]]


class BandFold:
    """Train points folded into band rows, but for the ranks in `keep` (the reader sends
    those as points). `add` each point; `rows()` then gives the rows in (attempt, name,
    step) order."""

    def __init__(self, keep: frozenset[int] = frozenset()):
        self.keep = keep
        # (attempt, name, step) -> [latest t, ranks, values]
        self._groups: dict[tuple, list] = {}

    def add(self, attempt: Any, name: str, step: Any, t: Any, rank: Any, value: Any) -> None:
        self.fold(attempt, [(None, t, step, name, value, rank, None)])

    def fold(self, attempt: Any, points: Iterable[tuple]) -> list[tuple]:
        """Fold points (index, t, step, name, value, rank, node) of one attempt; returns
        those of the kept ranks (the few points of a band read that are not in whole chunks)."""
        kept = []
        entries = []
        for point in points:
            _i, t, step, name, value, rank, _node = point
            if rank in self.keep:
                kept.append(point)
            elif value is not None and rank is not None:  # NaN is stored as None: not drawn
                entries.append([rank, None, [{"t": t, "step": step, "values": {name: value}}]])
        self.fold_chunk(attempt, entries)
        return kept

    def fold_chunk(self, attempt: Any, chunk: Iterable[list]) -> None:
        """Fold a whole chunk's entries as posted ([rank, node, entries]...), none of them a
        kept rank's: most of a band read, 80,000 points a second of a view of 4,096 ranks,
        in one loop without a tuple or a call per point."""
        groups = self._groups
        for rank, _node, entries in chunk:
            for entry in entries:
                step = entry.get("step")
                values = entry.get("values")
                if step is None or not values:
                    continue
                t = entry.get("t")
                for name, value in values.items():
                    group = groups.get((attempt, name, step))
                    if group is None:
                        groups[(attempt, name, step)] = [t, [rank], [value]]
                        continue
                    if t is not None and (group[0] is None or t > group[0]):
                        group[0] = t
                    group[1].append(rank)
                    group[2].append(value)

    def rows(self) -> list[dict]:
        out = []
        for (attempt, name, step), (t, ranks, values) in sorted(
                self._groups.items(), key=lambda item: (item[0][0] or 0, item[0][1], item[0][2])):
            outliers: list[dict] = []
            if len(values) >= MIN_GROUP:
                by_rank = dict(zip(ranks, values, strict=True))
                outliers = [{"rank": rank, "value": by_rank[rank]} for rank in outlier_ranks(by_rank)]
            out.append({"attempt": attempt, "name": name, "step": step, "t": t, "n": len(values),
                        "sum": sum(values), "lo": min(values), "hi": max(values),
                        "outliers": outliers})
        return out


def parse_ranks(text: str) -> frozenset[int]:
    """`ranks=` of a band read: comma-separated ranks, at most 64 (ValueError names the fault)."""
    words = [word for word in text.split(",") if word.strip()]
    if len(words) > 64:
        raise ValueError(f"at most 64 ranks, got {len(words)}")
    ranks = set()
    for word in words:
        word = word.strip()
        if not (word.isascii() and word.isdigit() and len(word) <= 9):
            raise ValueError(f"expected ranks as whole numbers separated by commas, got {word!r}")
        ranks.add(int(word))
    return frozenset(ranks)
