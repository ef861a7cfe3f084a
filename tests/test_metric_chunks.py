"""Metric points stored in chunks (issue 14): the seq scheme, paging inside a chunk, what a
point reads back as, retention rewriting chunks, the migration of a one-row-per-point data
dir. All on a real SQLite store."""

from __future__ import annotations

import math
import random
import sqlite3

import pytest

from jupyter_dlc.launcher import metric_chunks
from jupyter_dlc.launcher import retention as retention_module
from jupyter_dlc.launcher.metric_chunks import CHUNK, POINT_KEYS
from jupyter_dlc.launcher.retention import Retention, RetentionPolicy
from jupyter_dlc.launcher.store import Store

T0 = 1_700_000_000.0


def new_store(tmp_path, name: str = "db.sqlite") -> Store:
    store = Store(str(tmp_path / name))
    store.insert_job("j", "j", {}, "token", str(tmp_path))
    return store


def rank_reports(first_step: int, steps: int, ranks=(0, 1), per_second: int = 10) -> list[dict]:
    return [{"rank": rank, "node": 0, "metrics": [
        {"t": T0 + step / per_second, "step": step,
         "values": {"loss": math.sin(step * 0.7) + rank, "samples_per_s": 1000.0 + step % 7}}
        for step in range(first_step, first_step + steps)]} for rank in ranks]


def pages(store: Store, since: int = 0, limit: int = 7) -> list[list[dict]]:
    out = []
    while True:
        page = store.metrics("j", since, limit)
        if not page:
            return out
        out.append(page)
        since = page[-1]["seq"]


def test_points_page_across_chunks_and_inside_them(tmp_path):
    store = new_store(tmp_path)
    for step in range(0, 30, 3):  # one chunk per rank report: 3 entries x 2 values
        store.record_reports([("j", 1, rank_reports(step, 3))])
    # A report over CHUNK points is split: 2,100 entries x 2 values.
    store.record_reports([("j", 1, rank_reports(100, 2100, ranks=(5,)))])
    everything = store.metrics("j", 0, 10**6)
    assert len(everything) == 20 * 6 + 4200
    assert all(tuple(point) == POINT_KEYS for point in everything)
    seqs = [p["seq"] for p in everything]
    assert seqs == sorted(set(seqs))
    # A point's seq is its chunk's seq * CHUNK + its index there.
    chunks = {seq // CHUNK for seq in seqs}
    assert len(chunks) == 10 + 2  # a request's reports (here of two ranks) share a chunk
    assert max(seq % CHUNK for seq in seqs) == CHUNK - 1  # the split report filled a chunk

    paged = pages(store, limit=7)
    assert [p for page in paged for p in page] == everything
    assert any(page[-1]["seq"] % CHUNK not in (5, CHUNK - 1) for page in paged)  # ended inside one
    # Any cursor, inside a chunk or on its last point, gives exactly what follows it.
    for cursor in (seqs[2], seqs[5], seqs[6], seqs[119], seqs[2000], seqs[-1], seqs[0] - 1):
        assert store.metrics("j", cursor, 10**6) == [p for p in everything if p["seq"] > cursor]
    assert store.metrics("j", seqs[3], 2) == everything[4:6]
    # Points read back in the order they were logged, with their rank, step, name and value.
    first = [(p["rank"], p["step"], p["name"], p["value"]) for p in everything[:4]]
    assert first == [(0, 0, "loss", 0.0), (0, 0, "samples_per_s", 1000.0),
                     (0, 1, "loss", math.sin(0.7)), (0, 1, "samples_per_s", 1001.0)]


def test_values_read_back_as_the_column_stored_them(tmp_path):
    store = new_store(tmp_path)
    store.record_reports([("j", 1, [
        {"rank": 0, "metrics": [{"t": T0, "step": 1, "values": {"loss": float("nan"), "up": float("inf"),
                                                                  "down": float("-inf"), "whole": 3}}]},
        {"rank": 1, "metrics": [{"t": T0, "step": 1, "values": {"loss": 2}}],
         "system": [{"t": T0, "device": "gpu0", "values": {"gpu_util": 0.5}},
                    {"t": T0 + 1, "device": "gpu1", "values": {"gpu_util": 0.25}}]}])])
    points = {(p["rank"], p["name"], p["device"]): p["value"] for p in store.metrics("j")}
    assert points == {(0, "loss", None): None, (0, "up", None): math.inf, (0, "down", None): -math.inf,
                      (0, "whole", None): 3.0, (1, "loss", None): 2.0,
                      (1, "gpu_util", "gpu0"): 0.5, (1, "gpu_util", "gpu1"): 0.25}
    assert all(type(value) is float for value in points.values() if value is not None)
    assert [p["step"] for p in store.metrics("j") if p["kind"] == "system"] == [None, None]
    window = store.metric_window("j", T0 + 0.5)
    assert [(p["name"], p["device"], p["value"]) for p in window] == [("gpu_util", "gpu1", 0.25)]


def test_alerting_reads_only_the_names_it_wants_however_names_overlap(tmp_path):
    """The SQL skips chunks by name with a text test; names that contain another name (or
    its quotes) must not leak into the answer."""
    store = new_store(tmp_path)
    tricky = {"loss": 1.0, "val_loss": 2.0, 'x"loss': 3.0, "loss_scale": 4.0}
    store.record_reports([("j", 1, [{"rank": 0, "metrics": [{"t": T0, "step": 1, "values": tricky}]},
                                    {"rank": 1, "metrics": [{"t": T0, "step": 1, "values": {'x"loss': 5.0}}]}])])
    newest, points = store.metric_points("j", 0, ["loss"])
    assert [(name, value) for _, name, _, _, value, _ in points] == [("loss", 1.0)]
    assert newest == max(p["seq"] for p in store.metrics("j"))
    _, points = store.metric_points("j", 0, ['x"loss', "gpu_util"])
    assert [(rank, value) for _, _, _, rank, value, _ in points] == [(0, 3.0), (1, 5.0)]


def test_an_is_nan_rule_reads_each_ranks_last_point_of_a_new_chunk_and_every_point_otherwise(tmp_path):
    """`latest` names (what an `is nan` rule reads) give each rank's last logged point of a
    whole chunk that is all new, with the seq and value a full read has; a chunk the cursor
    cuts, a chunk holding NaN (stored as columns), and a name another rule reads in full
    give every point."""
    store = new_store(tmp_path)
    store.record_reports([("j", 1, rank_reports(0, 5))])
    store.record_reports([("j", 1, [{"rank": 0, "node": 0, "metrics": [
        {"t": T0 + 1, "step": 10, "values": {"loss": float("nan")}},
        {"t": T0 + 2, "step": 11, "values": {"loss": 2.0}}]}])])
    full = [(p["seq"], p["name"], p["t"], p["rank"], p["value"], p["device"])
            for p in store.metrics("j") if p["name"] == "loss"]
    newest, points = store.metric_points("j", 0, [], ["loss"])
    first_chunk = [p for p in full if p[2] < T0 + 1]
    lasts = [max((p for p in first_chunk if p[3] == rank), key=lambda p: p[0]) for rank in (0, 1)]
    assert points[:2] == lasts and [p[4] for p in points[:2]] == [math.sin(4 * 0.7), math.sin(4 * 0.7) + 1]
    # The NaN chunk is columns: both its points (NaN read back as None).
    assert [(p[2], p[4]) for p in points[2:]] == [(T0 + 1, None), (T0 + 2, 2.0)]
    assert newest == max(p["seq"] for p in store.metrics("j"))
    # A cursor inside the first chunk: every loss point after it.
    cut = first_chunk[3][0]
    assert store.metric_points("j", cut, [], ["loss"])[1] == [p for p in full if p[0] > cut]
    # Read in full by another rule: every point, as without `latest`.
    assert store.metric_points("j", 0, ["loss"], ["loss"])[1] == store.metric_points("j", 0, ["loss"])[1] == full
    # Another name read in full in the same chunks: all of it, and still only the last loss
    # (the chunk is walked entry by entry, not from each rank's last entry back).
    both = store.metric_points("j", 0, ["samples_per_s"], ["loss"])[1]
    assert sorted(both) == sorted(store.metric_points("j", 0, ["samples_per_s"])[1] + points)


def test_a_whole_chunks_lasts_are_the_last_points_a_full_read_finds(tmp_path):
    """The ingest notes each rank's last point of each name as it takes a batch (a chunk's
    `lasts`), and a latest read of a whole new chunk returns those without decoding it. They
    must be what a full read finds: here against the last point per chunk, rank and name of
    every stored point, over entries whose names differ, entries without values and a batch
    whose entries all have the same names. A chunk without lasts (a data dir from before
    them) is decoded and reads the same."""
    rng = random.Random(7)
    store = new_store(tmp_path)
    for batch in range(6):
        reports = []
        for rank in range(4):
            entries = []
            for step in range(rng.randint(1, 6)):
                names = rng.sample(["loss", "step_ms", "grad_sync_ms", "lr"], rng.randint(0, 4))
                entries.append({"t": T0 + batch * 10 + step, "step": step,
                                "values": {name: rng.uniform(-1, 1) for name in names}})
            reports.append({"rank": rank, "node": rank // 2, "metrics": entries})
        store.record_reports([("j", 1, reports)])
    store.record_reports([("j", 1, rank_reports(100, 5, ranks=(0, 1, 2)))])
    assert store.db.execute("SELECT COUNT(*) FROM metric_chunks WHERE lasts IS NULL").fetchone()[0] == 0
    latest = ["loss", "lr", "samples_per_s"]
    expected: dict[tuple, tuple] = {}
    for p in store.metrics("j", 0, 10**6):
        if p["name"] in latest:
            expected[(p["seq"] // CHUNK, p["rank"], p["name"])] = (
                p["seq"], p["name"], p["t"], p["rank"], p["value"], p["device"])
    newest, points = store.metric_points("j", 0, [], latest)
    assert points == sorted(expected.values()) and len(points) > 20
    with store.tx() as db:
        db.execute("UPDATE metric_chunks SET lasts = NULL")
    assert store.metric_points("j", 0, [], latest) == (newest, points)
    # A data dir from before the column: it is added, empty, on open.
    with store.tx() as db:
        db.execute("ALTER TABLE metric_chunks DROP COLUMN lasts")
    reopened = Store(str(tmp_path / "db.sqlite"))
    assert reopened.metric_points("j", 0, [], latest) == (newest, points)


def test_retention_rewrites_chunks_keeping_survivors_seqs_and_cursors(tmp_path):
    store = new_store(tmp_path)
    for step in range(0, 600, 5):  # 5 entries a report, 2 ranks: chunks of 20 points
        store.record_reports([("j", 1, rank_reports(step, 5))])
    before = {p["seq"]: p for p in store.metrics("j", 0, 10**6)}
    # A view's cursor in the middle of an old chunk, taken before retention runs.
    cursor = store.metrics("j", 0, 1234)[-1]["seq"]
    assert cursor % CHUNK not in (0, 19)
    retention = Retention(store, RetentionPolicy(keep_last=50, recent_steps=60, max_points=10**6))
    retention.run_pass()
    after = store.metrics("j", 0, 10**6)
    assert 0 < len(after) < len(before) / 2
    for point in after:  # every survivor: the same seq, the same point
        assert before[point["seq"]] == point
    assert store.metrics("j", cursor, 10**6) == [p for p in after if p["seq"] > cursor]
    assert [p["seq"] for page in pages(store, cursor, limit=3) for p in page] == \
        [p["seq"] for p in after if p["seq"] > cursor]
    # Chunks hold their survivors' original indices; whole ones none.
    rewritten = store.db.execute("SELECT COUNT(*) FROM metric_chunks WHERE n < 20").fetchone()[0]
    assert rewritten > 0
    # A rewritten chunk's lasts are gone (its last points may be too): readers decode it.
    assert store.db.execute("SELECT COUNT(*) FROM metric_chunks WHERE n < 20 AND lasts IS NOT NULL").fetchone()[0] == 0
    state = store.retention_state("j")
    assert state["dropped"] == len(before) - len(after)
    # New points after a pass keep counting from where the chunks are.
    store.record_reports([("j", 1, rank_reports(600, 5))])
    newest = store.metrics("j", after[-1]["seq"])
    assert len(newest) == 20 and newest[0]["seq"] > after[-1]["seq"]


def test_retention_over_passes_keeps_what_one_pass_over_everything_keeps(tmp_path, monkeypatch):
    """Each pass reads only what is new, and carries each series' newest bucket to the next
    (and from one batch of chunks to the next within a pass): points arriving in pieces end
    as if analyzed at once, and a pass decodes about as many chunks as became old since the
    last one."""
    policy = RetentionPolicy(keep_last=30, recent_steps=40, max_points=10**6)
    piecewise, at_once = new_store(tmp_path, "a.sqlite"), new_store(tmp_path, "b.sqlite")
    retention = Retention(piecewise, policy)
    reports = [rank_reports(step, 3, per_second=7) for step in range(0, 900, 3)]
    for piece in range(10):
        for rank_pair in reports[piece * 30:(piece + 1) * 30]:
            piecewise.record_reports([("j", 1, rank_pair)])
        decoded = retention.decoded
        retention.run_pass()
        if piece:  # 30 new chunks a piece, as many become old, and a few carried chunks
            assert retention.decoded - decoded <= 30 + 10, retention.decoded - decoded
    for rank_pair in reports:
        at_once.record_reports([("j", 1, rank_pair)])
    once = Retention(at_once, policy)
    with monkeypatch.context() as patch:
        patch.setattr(retention_module, "_BATCH", 5)  # the one pass in batches of 5 chunks (15/7 s)
        once.run_pass()
    retention.run_pass()  # a quiet pass: the chunks only partly old too
    once.run_pass()

    def kept(store: Store) -> list[tuple]:
        return [(p["rank"], p["step"], p["name"], p["value"]) for p in store.metrics("j", 0, 10**6)]

    assert kept(piecewise) == kept(at_once)
    assert len(kept(at_once)) < 6 * 900 / 2
    assert piecewise.retention_state("j")["dropped"] == at_once.retention_state("j")["dropped"]
    # Nothing new: a pass reads no chunk; once points come again, the job is tracked anew.
    decoded = retention.decoded
    retention.run_pass()
    assert retention.decoded == decoded
    for store, analysis in ((piecewise, retention), (at_once, once)):
        for step in range(900, 990, 3):
            store.record_reports([("j", 1, rank_reports(step, 3, per_second=7))])
        analysis.run_pass()
        analysis.run_pass()
    assert kept(piecewise) == kept(at_once)
    assert [p[1] for p in kept(piecewise) if p[0] == 0 and p[2] == "loss"][-30:] == list(range(960, 990))
    # An ended job's tracking is let go after a quiet pass, and nothing is read again.
    assert piecewise.transition("j", "SUCCEEDED", "done")
    retention.run_pass()
    assert "j" not in retention._tracks  # the memory it held
    decoded = retention.decoded
    retention.run_pass()
    assert retention.decoded == decoded and kept(piecewise) == kept(at_once)


def test_a_data_dir_with_one_row_per_point_is_migrated_to_chunks(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE metrics (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, t REAL NOT NULL,
            attempt INTEGER, rank INTEGER, node INTEGER, step INTEGER, kind TEXT NOT NULL,
            name TEXT NOT NULL, value REAL, device TEXT);
        CREATE INDEX metrics_job ON metrics (job_id, seq);""")
    rows = []
    for step in range(3):  # what the old store wrote for two reports of two ranks
        for rank in (0, 1):
            rows += [("j", T0 + step, 1, rank, 0, step, "train", "loss", 1.0 / (step + 1) if step != 1 else None, None),
                     ("j", T0 + step, 1, rank, 0, step, "train", "acc", float(step), None)]
    rows += [("j", T0 + 5, 1, 0, 0, None, "system", "gpu_util", 0.5, "gpu0"),
             ("j", T0 + 5, 1, 0, 0, None, "system", "gpu_util", 0.75, "gpu1"),
             ("k", T0 + 6, 2, 3, 1, 9, "train", "loss", float("inf"), None)]
    db.executemany("INSERT INTO metrics (job_id, t, attempt, rank, node, step, kind, name, value,"
                   " device) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    old = {row[0]: row for row in db.execute("SELECT * FROM metrics")}
    db.close()

    store = Store(str(path))
    tables = {row[0] for row in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "metrics" not in tables and "metric_chunks" in tables
    for job in ("j", "k"):
        points = store.metrics(job, 0, 10**6)
        expected = [dict(zip(POINT_KEYS, row, strict=True)) for row in old.values() if row[1] == job]
        assert [{**p, "seq": None} for p in points] == [{**p, "seq": None} for p in expected]
        # A point's new seq is at least its old one: an old cursor never skips a point.
        assert all(p["seq"] >= e["seq"] for p, e in zip(points, expected, strict=True))
        assert [p["seq"] for p in points] == sorted({p["seq"] for p in points})
    # Consecutive rows of one job, attempt, kind and device became one chunk: the train
    # rows of j, its system rows of each device, and k's.
    assert store.db.execute("SELECT COUNT(*) FROM metric_chunks").fetchone()[0] == 1 + 2 + 1
    # New points come after the migrated ones; opening again changes nothing.
    store.insert_job("j", "j", {}, "token", str(tmp_path))
    store.record_reports([("j", 1, [{"rank": 0, "metrics": [{"t": T0 + 9, "step": 9, "values": {"loss": 0.1}}]}])])
    again = Store(str(path))
    points = again.metrics("j", 0, 10**6)
    assert len(points) == 15 and points[-1]["value"] == 0.1 and points[-1]["seq"] > points[-2]["seq"]
    Retention(again, RetentionPolicy(keep_last=1, recent_steps=1, max_points=10**6)).run_pass()
    assert again.metrics("j", 0, 10**6)[-1]["value"] == 0.1


def test_a_chunk_counts_each_series(tmp_path):
    """A chunk row says how many points each rank has of each name: retention counts a
    series without decoding the chunk."""
    builder = metric_chunks.ChunkBuilder("j", 1, T0)
    builder.add(0, {"node": 0, "metrics": [
        {"t": T0, "step": 1, "values": {"loss": 1.0, "lr": 0.1}},
        {"t": T0, "step": 2, "values": {"loss": 1.0}},
        {"step": 3}]})  # no values, no time: only its step counts
    builder.add(3, {"node": 0, "metrics": [{"t": T0 + 1, "step": 7, "values": {"loss": 2.0}}]})
    (row,) = builder.rows()
    assert row[2:4] == (None, None)  # rank, node: several ranks
    assert metric_chunks.ranks_of(row[6]) == (0, 3)
    assert metric_chunks.counts_of(row[7]) == {"loss": [2, 1], "lr": [1, 0]}
    assert row[8:13] == (4, 3, T0, T0 + 1, 7)  # n, top, t_first, t_last, step_max


def test_a_chunk_rewritten_while_partly_old_keeps_its_recent_points_later(tmp_path):
    """A batch upload's chunk is analyzed while only partly old (its last points among the
    last keep_last); rewritten, it has fewer points than the series counts say: later passes
    must still keep every point among the last keep_last."""
    store = new_store(tmp_path)
    policy = RetentionPolicy(keep_last=40, recent_steps=1, max_points=10**6)
    retention = Retention(store, policy)
    store.record_reports([("j", 1, rank_reports(0, 300, per_second=10))])  # one chunk: 1,200 points
    retention.run_pass()
    for step in range(300, 330, 3):
        store.record_reports([("j", 1, rank_reports(step, 3, per_second=10))])
        retention.run_pass()
        points = store.metrics("j", 0, 10**6)
        for rank in (0, 1):
            for name in ("loss", "samples_per_s"):
                steps = [p["step"] for p in points if p["rank"] == rank and p["name"] == name]
                assert steps[-40:] == list(range(step + 3 - 40, step + 3)), (rank, name, steps[-45:])


def test_a_band_read_folds_each_train_point_once_however_it_is_paged(tmp_path):
    """A view past 8 ranks reads bands (jupyter_dlc/bands.py): every train point of a rank it
    does not keep is folded into its step's row exactly once, whatever pages the reads
    cut; kept ranks' points and system points come as points; rows of one step add up to
    the step's count, sum, min and max over the ranks."""
    from jupyter_dlc.bands import BandFold

    store = new_store(tmp_path)
    ranks = range(12)
    for step in range(0, 12, 3):
        reports = rank_reports(step, 3, ranks=ranks)
        reports[0]["system"] = [{"t": T0 + step, "device": "cpu", "values": {"cpu_util": 50.0}}]
        store.record_reports([("j", 1, reports[:5]), ("j", 1, reports[5:])])
    everything = store.metrics("j", 0, 10**6)
    keep = frozenset({3})
    expected: dict = {}
    for p in everything:
        if p["kind"] == "train" and p["rank"] not in keep:
            expected.setdefault((p["name"], p["step"]), []).append(p["value"])
    for limit in (7, 50, 10**6):
        merged: dict = {}
        points: list = []
        since = 0
        while True:
            fold = BandFold(keep)
            page, last = store.metric_page("j", since, limit, fold)
            if last == since:
                break
            points += page
            for row in fold.rows():
                n, total, lo, hi = merged.get((row["name"], row["step"]), (0, 0.0, math.inf, -math.inf))
                merged[(row["name"], row["step"])] = (n + row["n"], total + row["sum"],
                                                      min(lo, row["lo"]), max(hi, row["hi"]))
            since = last
        assert points == [p for p in everything if p["kind"] == "system" or p["rank"] in keep]
        assert set(merged) == set(expected)
        for key, values in expected.items():
            n, total, lo, hi = merged[key]
            assert (n, lo, hi) == (11, min(values), max(values))
            assert total == pytest.approx(sum(values))


def test_band_rows_name_the_ranks_that_stand_out_only_among_enough_values():
    from jupyter_dlc.bands import MIN_GROUP, BandFold, parse_ranks

    fold = BandFold()
    for rank in range(16):
        fold.add(1, "loss", 5, T0 + rank, rank, 1.0 + (rank % 3) * 1e-3 + (40.0 if rank == 9 else 0.0))
    for rank in range(MIN_GROUP - 1):  # too few values to judge
        fold.add(1, "loss", 6, T0, rank, 100.0 if rank == 0 else 1.0)
    fold.add(1, "loss", 7, T0, 0, None)  # NaN (stored as None) is not drawn
    five, six = fold.rows()
    assert (five["step"], five["n"], five["t"], five["hi"]) == (5, 16, T0 + 15, pytest.approx(41.0))
    assert five["outliers"] == [{"rank": 9, "value": pytest.approx(41.0)}]
    assert six["n"] == MIN_GROUP - 1 and six["outliers"] == [] and six["hi"] == 100.0
    assert parse_ranks("3, 17,,4") == frozenset({3, 4, 17}) and parse_ranks("") == frozenset()
    for bad in ("x", "-1", "1.5", ",".join(map(str, range(65)))):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_a_ranks_chunks_and_the_newest_step_times_are_found_in_sql(tmp_path):
    """What the goodput ledger reads at every look (launcher/goodput.py): only the chunks
    that hold rank 0's points (a node's batch lists its ranks in any order; rank 0 is not
    rank 10 or 100), and each attempt's newest train time from the chunks' columns."""
    store = Store(str(tmp_path / "store.sqlite"))
    store.insert_job("j", "j", {"nodes": 1, "nproc_per_node": 1}, "token", str(tmp_path))

    def report(rank, t, step=1):
        return {"rank": rank, "metrics": [{"t": t, "step": step, "values": {"loss": 1.0}}]}

    store.record_reports([("j", 1, [report(3, 5.0), report(0, 4.0)])])
    first = store.newest_metric_seq("j")
    store.record_reports([("j", 1, [report(5, 9.0), report(6, 8.0), report(100, 7.0)])])
    store.record_reports([("j", 2, [report(10, 3.0)])])
    ranks = lambda points: sorted({p["rank"] for p in points})  # noqa: E731
    assert ranks(store.metric_page("j", 0, rank=0)[0]) == [0, 3]
    assert ranks(store.metric_page("j", 0, rank=6)[0]) == [5, 6, 100]
    assert ranks(store.metric_page("j", 0, rank=10)[0]) == [10]
    assert store.metric_page("j", first, rank=0) == ([], first)  # nothing of rank 0 after it
    assert store.metric_page("j", 0, rank=1) == ([], 0)
    assert store.newest_train_times("j", 0) == {1: 9.0, 2: 3.0}
    assert store.newest_train_times("j", first) == {1: 9.0, 2: 3.0}
    assert store.newest_train_times("j", store.newest_metric_seq("j")) == {}
