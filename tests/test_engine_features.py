"""ARCHITECTURE.md's engine-by-feature table is what the engines declare, and what the
launcher does follows the declaration (no cluster needed: capabilities are read from the
engines for profiles written to a temporary clusters file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jupyter_dlc.engines import features
from jupyter_dlc.engines.contract import Capabilities
from jupyter_dlc.launcher.pools import cannot_pool

ARCHITECTURE = Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"


def test_the_documented_table_is_the_declared_one():
    text = ARCHITECTURE.read_text()
    assert features.BEGIN in text, "ARCHITECTURE.md lost its engine-by-feature table"
    shown = features.BEGIN + text.split(features.BEGIN, 1)[1].split(features.END, 1)[0] + features.END
    assert shown == features.table(), (
        "ARCHITECTURE.md's engine-by-feature table differs from the engines' capabilities: "
        "paste the output of `python -m jupyter_dlc.engines.features` there")


def test_every_capability_has_its_row_and_every_column_differs_from_the_defaults_somewhere():
    rows = features.table().splitlines()[3:-1]
    assert len(rows) == len(dataclasses.fields(Capabilities))
    assert all(f.metadata.get("feature") for f in dataclasses.fields(Capabilities))
    declared = features.declared()
    assert set(declared) == {column for column, _, _ in features.COLUMNS}
    # A column that answered the base class's defaults would mean an engine never asked.
    assert all(caps != Capabilities() for caps in declared.values())


def test_pool_up_refuses_exactly_where_warm_pools_is_no():
    declared = features.declared()
    for column, engine, options in features.COLUMNS:
        refusal = cannot_pool(engine, options)
        assert (refusal is None) == declared[column].warm_pools, (column, refusal)
        if refusal:
            assert "jobs start cold" in refusal

