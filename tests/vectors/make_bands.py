"""Writes tests/vectors/bands.json (python tests/vectors/make_bands.py): cases whose
expectations are worked out here by hand-rule arithmetic, not by running either implementation."""
import json

W = 10  # past MAX_RANK_LINES: folded bands


def row(step, values, outliers=(), attempt=1, name="loss"):
    return {"row": {"attempt": attempt, "name": name, "step": step, "n": len(values),
                    "sum": sum(values), "lo": min(values), "hi": max(values), "t": 1000.0 + step,
                    "outliers": [{"rank": r, "value": v} for r, v in outliers]}}


def point(step, rank, value, attempt=1, name="loss"):
    return {"point": {"attempt": attempt, "name": name, "step": step, "rank": rank,
                      "value": value, "t": 1000.0 + step, "kind": "train"}}


cases = []
# 1. Whole steps, one row each: a band point per step, no outlier.
cases.append({"name": "whole steps", "world_size": W,
              "inputs": [row(s, [s] * W) for s in (1, 2, 3)],
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], "outliers": {}}},
              "outliers": []})
# 2. A step split over two rows is drawn once all ten ranks are in, as one band point.
cases.append({"name": "a step over two rows", "world_size": W,
              "inputs": [row(1, [2] * 6), row(1, [4] * 4)],
              "expect": {"loss": {"band": [[1, 2.8, 2, 4]], "outliers": {}}}, "outliers": []})
# 3. Step 2 completes before step 1: the band stays in step order.
cases.append({"name": "out of order", "world_size": W,
              "inputs": [row(1, [1] * 9), row(2, [2] * 10), row(1, [1])],
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 2, 2, 2]], "outliers": {}}}, "outliers": []})
# 4. An outlier candidate becomes an outlier when its step is drawn; its later points (the
#    launcher then sends them as points, out of the rows) go to its own line and the band.
cases.append({"name": "an outlier, then its own points", "world_size": W,
              "inputs": [row(1, [1] * 9 + [11], outliers=[(9, 11)]),
                         row(2, [2] * 9), point(2, 9, 12)],
              "expect": {"loss": {"band": [[1, 2, 1, 11], [2, 3, 2, 12]],
                                  "outliers": {"9": [[1, 11], [2, 12]]}}}, "outliers": [9]})
# 5. At most three outliers, farthest from the mean first.
far = [(6, 5), (7, 9), (8, 13), (9, 20)]
values = [1] * 6 + [5, 9, 13, 20]  # mean 5.3
cases.append({"name": "three outliers, farthest first", "world_size": W,
              "inputs": [row(1, values, outliers=far)],
              "expect": {"loss": {"band": [[1, 5.3, 1, 20]],
                                  "outliers": {"9": [[1, 20]], "8": [[1, 13]], "7": [[1, 9]]}}},
              "outliers": [9, 8, 7]})
# 6. A rank that stopped logging: a step is drawn partially once 64 newer steps wait.
stalled = [row(s, [s] * 9) for s in range(1, 67)]  # rank 9 never logs: 66 steps pending
cases.append({"name": "partial after 64 waiting steps", "world_size": W, "inputs": stalled,
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 2, 2, 2]], "outliers": {}}},
              "outliers": []})
# 7. A late value for a step already drawn draws nothing more (no second band point).
cases.append({"name": "late value of a drawn step", "world_size": W,
              "inputs": [row(1, [1] * 10), row(2, [2] * 10), point(1, 3, 50)],
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 2, 2, 2]], "outliers": {}}}, "outliers": []})
# 8. A new attempt resumes at step 2: what attempt 1 drew from step 2 on is cut, and what
#    attempt 1 sends late is dropped.
cases.append({"name": "a new attempt cuts the lines", "world_size": W,
              "inputs": [row(1, [1] * 10), row(2, [2] * 10), row(3, [3] * 10),
                         row(2, [7] * 10, attempt=2), row(4, [4] * 10, attempt=1)],
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 7, 7, 7]], "outliers": {}}}, "outliers": []})
# 9. Two metrics fold apart.
cases.append({"name": "two metrics", "world_size": W,
              "inputs": [row(1, [1] * 10), row(1, [0.5] * 10, name="lr")],
              "expect": {"loss": {"band": [[1, 1, 1, 1]], "outliers": {}},
                         "lr": {"band": [[1, 0.5, 0.5, 0.5]], "outliers": {}}}, "outliers": []})

# 10. A late value of a drawn step is not kept waiting either: once 64 steps wait (rank 9
#     stalled from step 2), the oldest drawn are 2 and 3, not a second step 1 of that value.
cases.append({"name": "a late value never comes back as a partial step", "world_size": W,
              "inputs": [row(1, [1] * 10), point(1, 3, 50)] + [row(s, [s] * 9) for s in range(2, 68)],
              "expect": {"loss": {"band": [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], "outliers": {}}},
              "outliers": []})

with open("tests/vectors/bands.json", "w") as f:
    json.dump({"about": "Band folding in the views, specified once: both implementations (Python "
                        "widgets/series.py TrainData, TypeScript labextension/src/bands.ts BandSeries) "
                        "read these inputs (the launcher's band rows and kept ranks' points, in "
                        "order) and must draw exactly these band points [step, mean, lo, hi] and "
                        "outlier lines {rank: [[step, value]]}, outliers in the order found. "
                        "Expectations are worked out by hand (tests/vectors/make_bands.py writes "
                        "them, each case with the reasoning); "
                        "tests/test_band_vectors.py and labextension/test/bandvectors.test.ts read them.",
               "cases": cases}, f, indent=1)
print(len(cases), "cases")
