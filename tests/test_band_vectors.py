"""Band folding, specified once (tests/vectors/bands.json, read by the panel's jest suite too:
labextension/test/bandvectors.test.ts): the notebook view's TrainData draws exactly the band
points and outlier lines each case expects from the launcher's rows and points."""

from __future__ import annotations

import json
import os

import pytest

from jupyter_dlc.widgets.series import TrainData

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors", "bands.json")
CASES = json.load(open(VECTORS))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_notebook_view_draws_what_the_vectors_say(case):
    train = TrainData(case["world_size"], capacity=10_000)
    for item in case["inputs"]:
        if "row" in item:
            train.add_band(item["row"])
        else:
            train.add(item["point"])
    drawn = {}
    for name, lines in train.lines.items():
        band = lines.get("mean")
        rows = [] if band is None else [[x, y, lo, hi] for x, y, lo, hi in
                                        zip(band.x, band.y, band.cols["lo"], band.cols["hi"], strict=True)]
        outliers = {str(key): [[x, y] for x, y in zip(line.x, line.y, strict=True)]
                    for key, line in lines.items() if key != "mean" and line.x}
        drawn[name] = {"band": rows, "outliers": outliers}
    expected = {name: {"band": [[pytest.approx(v) for v in r] for r in want["band"]],
                       "outliers": want["outliers"]} for name, want in case["expect"].items()}
    assert {n: d for n, d in drawn.items() if d["band"] or d["outliers"]} == expected
    assert train.outliers == case["outliers"]
