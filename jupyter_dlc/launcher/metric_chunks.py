"""Metric points stored in chunks: one SQLite row per report request, kind and device.

4,096 ranks logging 2 values 10 times a second are 81,920 points a second. As one row per
point, SQLite's per-row insert (and Python's 10-tuple per point) cost about 0.3 s of CPU per
second of that load, the launcher's largest single cost. So the train entries a request
carries (one rank's report, or a node's batch of its ranks' reports) are one chunk, and its
system entries one chunk per device. A chunk per request, not per rank report: retention
decodes and rewrites every chunk once as it ages, and its cost goes by the chunk (measured:
a chunk per rank report cost it 0.75 s of CPU per second of 4,096-rank load; see
ARCHITECTURE.md, "Metrics storage").

`data` holds the points as compact JSON (orjson, in C). While a chunk is whole, train
entries as the ranks posted them: `[[rank, node, [{"t", "step", "values": {name: value}}...]]
...]` (storing them costs one C call, not Python work per point). Once retention rewrote it,
and for system entries and entries that are not plain finite numbers, columns `{"t", "s"
(train only), "k" (index into `names`), "v", "r" (rank), "o" (node), "i"}`, `i` being each
point's original index, absent while the chunk is whole. A value reads back as a float, NaN
as None (what SQLite did with a NaN REAL), +-inf as floats (such a chunk is written by the
standard library, as JSON's Infinity, since orjson writes null).

`ranks` lists the chunk's ranks; `names` is {name: [points of that rank, in `ranks` order]}
in compact JSON, so that a reader wanting only `loss` skips a chunk in SQL (`instr(names,
'"loss":')`, then an exact test on what it decodes) and retention counts each series' points
without decoding. `rank` and `node` are set when the chunk holds one rank. `top` is the
index of the chunk's last point; `n`, `t_first`, `t_last`, `step_max` let readers and
retention skip chunks unread. `lasts`, while a chunk is whole, is each rank's last point of
each name, `[[index, name, t, rank, value]...]` in index order, noted by the ingest worker as
it takes the entries (it walks them anyway): the alert rules and the straggler detector read
the newest point of a name alone, and decoding a whole node batch to find 48 of its 500
values was most of the launcher's alerting cost at 4,096 ranks (benchmarks/HISTORY.md,
2026-12-06). NULL once retention rewrote the chunk, and in columns chunks.

On the wire a point keeps a seq as before: `chunk seq * CHUNK + index` (a chunk holds at most
CHUNK points; a larger request is split), unique and increasing, and stable when retention
removes other points of its chunk. A `since` cursor maps back: chunks with seq >= since //
CHUNK, and in that chunk the indices above since % CHUNK.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import sqlite3
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from .. import wirejson

CHUNK = 4096

SCHEMA = """
CREATE TABLE IF NOT EXISTS metric_chunks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, attempt INTEGER, rank INTEGER,
    node INTEGER, kind TEXT NOT NULL, device TEXT, ranks TEXT NOT NULL, names TEXT NOT NULL,
    n INTEGER NOT NULL, top INTEGER NOT NULL, t_first REAL, t_last REAL, step_max INTEGER,
    data TEXT NOT NULL, lasts TEXT
);
CREATE INDEX IF NOT EXISTS metric_chunks_job ON metric_chunks (job_id, seq);
"""
_COLUMNS = ("job_id, attempt, rank, node, kind, device, ranks, names, n, top, t_first, t_last,"
            " step_max, data, lasts")
_PLACES = ", ".join("?" * len(_COLUMNS.split(",")))
INSERT = f"INSERT INTO metric_chunks ({_COLUMNS}) VALUES ({_PLACES})"
# What retention rewrites of a chunk: the columns after `device` in a chunk row.
REWRITE = ("UPDATE metric_chunks SET rank = ?, node = ?, ranks = ?, names = ?, n = ?, top = ?,"
           " t_first = ?, t_last = ?, step_max = ?, data = ?, lasts = NULL WHERE seq = ?")
# What a reader of points selects, in the order `read_points` takes it.
POINT_COLUMNS = "seq, job_id, attempt, kind, device, ranks, names, top, data"
# A point as every reader returns it: the columns of the one-row-per-point table it replaces.
POINT_KEYS = ("seq", "job_id", "t", "attempt", "rank", "node", "step", "kind", "name", "value", "device")

# orjson writes a non-finite float as null: a chunk holding +-inf is written by the
# standard library (as Infinity), which also reads what orjson cannot.
_dumps_any = json.JSONEncoder(separators=(",", ":")).encode


@functools.lru_cache(maxsize=4096)
def names_of(text: str) -> tuple[str, ...]:
    """A chunk's names in index order (a few distinct `names` texts recur in every chunk)."""
    return tuple(orjson.loads(text))


@functools.lru_cache(maxsize=4096)
def counts_of(text: str) -> dict[str, list[int]]:
    """A chunk's {name: [points per rank]} (do not change the answer: it is shared)."""
    return orjson.loads(text)


@functools.lru_cache(maxsize=4096)
def ranks_of(text: str) -> tuple[int, ...]:
    return tuple(orjson.loads(text))


def _all_finite(values: list) -> bool:
    return math.isfinite(sum(v for v in values if v is not None) if None in values else sum(values))


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if number != number else number


class ChunkBuilder:
    """The chunk rows (INSERT's order) of one request's rank reports: `add` each report, then
    `rows`. Runs for every report of every rank: per entry only what the row needs (last
    step, point count, names), no work per point; the entries are written as they came."""

    def __init__(self, job_id: str, attempt: int, now: float):
        self.job_id = job_id
        self.attempt = attempt
        self.now = now
        self._parts: list[list] = []          # [rank, node, entries] of the train chunk
        self._lasts: list[list] = []          # its `lasts`
        self._counts: dict[str, dict[int, int]] = {}
        self._n = 0
        self._rows: list[tuple] = []
        self._unusual: list[tuple[int, Any, list]] = []
        self._system: dict[Any, list[tuple[int, Any, list]]] = {}

    def add(self, rank: int, report: dict) -> tuple[int | None, tuple[float | None] | None]:
        """Take one rank report's points; returns its last step and (its last loss,)."""
        node = report.get("node")
        last_step = None
        loss = None
        entries = report.get("metrics")
        if entries:
            n = 0
            first = None
            uniform = True  # every entry has the same names
            with_values = 0
            usual = True  # numbers, finite, with their time: the entries can be written as they are
            for entry in entries:
                step = entry.get("step")
                if step is not None and (last_step is None or step > last_step):
                    last_step = step
                values = entry.get("values")
                if values:
                    n += len(values)
                    with_values += 1
                    if first is None:
                        first = values
                    elif uniform and values.keys() != first.keys():
                        uniform = False
                    if "loss" in values:
                        loss = (values["loss"],)
                    if usual:
                        try:
                            usual = "t" in entry and math.isfinite(sum(values.values()))
                        except (TypeError, OverflowError):
                            usual = False
            if n and usual and n <= CHUNK:
                if self._n + n > CHUNK:
                    self._flush_train()
                self._parts.append([rank, node, entries])
                self._n += n
                self._lasts += _lasts_of(rank, entries, self._n, uniform)
                counts = self._counts
                if uniform and first is not None:
                    for key in first:
                        per_rank = counts.setdefault(key, {})
                        per_rank[rank] = per_rank.get(rank, 0) + with_values
                else:
                    for entry in entries:
                        for key in entry.get("values") or ():
                            per_rank = counts.setdefault(key, {})
                            per_rank[rank] = per_rank.get(rank, 0) + 1
            elif n:
                self._unusual.append((rank, node, entries))
            if loss is not None:
                loss = (_finite(loss[0]),)
        system = report.get("system")
        if system:
            for entry in system:
                if entry.get("values"):
                    self._system.setdefault(entry.get("device"), []).append((rank, node, [entry]))
        return last_step, loss

    def _flush_train(self) -> None:
        if not self._parts:
            return
        parts = self._parts
        ranks = list(dict.fromkeys(rank for rank, _node, _entries in parts))
        names = {name: [per_rank.get(rank, 0) for rank in ranks] for name, per_rank in self._counts.items()}
        steps = [entry.get("step") for _rank, _node, entries in parts for entry in entries]
        steps = [step for step in steps if step is not None]
        one = len(ranks) == 1 and len({node for _rank, node, _entries in parts}) == 1
        try:
            times = [entry["t"] for _rank, _node, entries in parts for entry in entries if entry.get("values")]
            self._rows.append((self.job_id, self.attempt, ranks[0] if one else None,
                               parts[0][1] if one else None, "train", None,
                               orjson.dumps(ranks).decode(), orjson.dumps(names).decode(), self._n,
                               self._n - 1, min(times), max(times), max(steps, default=None),
                               orjson.dumps(parts), orjson.dumps(self._lasts).decode()))
        except TypeError:  # a name, number or time orjson cannot write (direct callers)
            self._unusual += [tuple(part) for part in parts]
        self._parts, self._counts, self._n, self._lasts = [], {}, 0, []

    def rows(self) -> list[tuple]:
        self._flush_train()
        if self._unusual:
            self._columns("train", None, self._unusual)
        for device, parts in self._system.items():
            self._columns("system", device, parts)
        return self._rows

    def _columns(self, kind: str, device: Any, parts: list[tuple[int, Any, list]]) -> None:
        """Entries written through Python, as columns: system entries; train entries with
        more than CHUNK points, a missing time or a value that is not a finite number."""
        head = (self.job_id, self.attempt, kind, device)
        names: dict[str, int] = {}
        cols: dict[str, list] = {"t": [], "s": [], "k": [], "v": [], "r": [], "o": []}
        for rank, node, entries in parts:
            for entry in entries:
                t = _finite(entry.get("t", self.now))
                step = entry.get("step")
                for name, value in (entry.get("values") or {}).items():
                    if len(cols["v"]) == CHUNK:
                        self._rows.append(chunk_row(head, list(names), cols))
                        names, cols = {}, {key: [] for key in cols}
                    cols["t"].append(t)
                    cols["s"].append(step)
                    cols["k"].append(names.setdefault(str(name), len(names)))
                    cols["v"].append(_finite(value) if type(value) is not float else value)
                    cols["r"].append(rank)
                    cols["o"].append(node)
        if cols["v"]:
            self._rows.append(chunk_row(head, list(names), cols))


def _lasts_of(rank: int, entries: list[dict], end: int, uniform: bool) -> list[list]:
    """`lasts` of one rank's entries whose points end before chunk index `end`: [[index,
    name, t, rank, value]...] of its last point of each name, in index order. `uniform`:
    every entry with values has the same names (then the last one holds them all)."""
    found: dict[str, list] = {}
    at = end
    for entry in reversed(entries):
        values = entry.get("values")
        if not values:
            continue
        at -= len(values)
        for i, name in enumerate(values):
            if name not in found:
                found[name] = [at + i, name, entry.get("t"), rank, values[name]]
        if uniform:
            break
    return sorted(found.values(), key=lambda last: last[0])


def chunk_row(head: tuple, names: list, cols: dict[str, list]) -> tuple:
    """The row of a columns chunk for INSERT, `head` being (job_id, attempt, kind, device):
    cols t, s (None for system chunks), k, v (floats or None), r, o, and i (None while whole)."""
    job_id, attempt, kind, device = head
    rank, node, *rest = columns_fields(kind, names, cols)
    return (job_id, attempt, rank, node, kind, device, *rest, None)


def columns_fields(kind: str, names: list, cols: dict[str, list]) -> tuple:
    """(rank, node, ranks, names, n, top, t_first, t_last, step_max, data) of a columns chunk."""
    v_col = cols["v"]
    finite = _all_finite(v_col)
    if not finite:  # NaN is stored as null
        v_col = [None if v != v else v for v in v_col]
    r_col, o_col, k_col = cols["r"], cols["o"], cols["k"]
    ranks = list(dict.fromkeys(r_col))
    pairs = collections.Counter(zip(k_col, r_col, strict=True))
    counts = [[pairs.get((k, rank), 0) for rank in ranks] for k in range(len(names))]
    data: dict[str, list] = {"t": cols["t"], "k": k_col, "v": v_col, "r": r_col, "o": o_col}
    step_max = None
    if kind == "train":
        data["s"] = cols["s"]
        steps = cols["s"]
        step_max = max((s for s in steps if s is not None), default=None) if None in steps else max(steps, default=None)
    if cols.get("i") is not None:
        data["i"] = cols["i"]
    one = len(ranks) == 1 and len(set(o_col)) == 1
    times = [t for t in cols["t"] if t is not None] if None in cols["t"] else cols["t"]
    return (ranks[0] if one else None, o_col[0] if one else None, orjson.dumps(ranks).decode(),
            orjson.dumps(dict(zip(names, counts, strict=True))).decode(), len(v_col),
            cols["i"][-1] if cols.get("i") is not None else len(v_col) - 1,
            min(times, default=None), max(times, default=None), step_max,
            orjson.dumps(data) if finite else _dumps_any(data))


def decode(names: str, data: bytes | str) -> tuple[list, list, list, list, Any, list, list]:
    """The points of a chunk as columns: (t, step, name, value, original index: a list, or a
    range while the chunk is whole, rank, node)."""
    d = wirejson.loads(data)
    if type(d) is list:  # whole: the entries as posted, per rank
        t_col: list = []
        s_col: list = []
        n_col: list = []
        v_col: list = []
        r_col: list = []
        o_col: list = []
        for rank, node, entries in d:
            start = len(v_col)
            for entry in entries:
                values = entry.get("values")
                if values:
                    count = len(values)
                    t_col += [entry.get("t")] * count
                    s_col += [entry.get("step")] * count
                    n_col += values
                    v_col += values.values()
            r_col += [rank] * (len(v_col) - start)
            o_col += [node] * (len(v_col) - start)
        # JSON keeps a whole number as one; the column read back floats
        return (t_col, s_col, n_col, [v if v is None or type(v) is float else float(v) for v in v_col],
                range(len(v_col)), r_col, o_col)
    v = d["v"]
    labels = names_of(names)
    return (d["t"], d.get("s") or [None] * len(v), [labels[k] for k in d["k"]], v,
            d.get("i") or range(len(v)), d["r"], d["o"])


def read_points(out: list, rows: Iterator[tuple], since: int, limit: int, fold: Any = None) -> int:
    """Append to `out`, as dicts, the points after `since` of chunk rows (POINT_COLUMNS, in
    seq order), reading at most `limit` points; returns the seq of the last point read
    (`since` when none). With a `fold` (bands.BandFold), train points of ranks it does not
    keep go to the fold instead of `out`."""
    read = 0
    last = since
    for seq, job_id, attempt, kind, device, ranks, names, top, data in rows:
        base = seq * CHUNK
        if base + top <= since:
            continue
        if fold is not None and kind == "train" and since < base and read + top < limit and \
                data[:1] in (b"[", "[") and fold.keep.isdisjoint(ranks_of(ranks)):
            # Most of a band read: a whole chunk, all of it read, none of it kept. Its entries
            # go to the fold as posted, without the columns `decode` builds.
            fold.fold_chunk(attempt, wirejson.loads(data))
            read += top + 1
            last = base + top
            if read >= limit:
                break
            continue
        t, s, n, v, idx, r, o = decode(names, data)
        start = bisect_right(idx, since - base) if since >= base else 0
        end = min(len(v), start + limit - read)
        if end <= start:
            continue
        points: Iterable[tuple] = zip(idx[start:end], t[start:end], s[start:end], n[start:end],
                                      v[start:end], r[start:end], o[start:end], strict=True)
        if fold is not None and kind == "train":
            points = fold.fold(attempt, points)
        for p, ti, si, ni, vi, ri, oi in points:
            out.append({"seq": base + p, "job_id": job_id, "t": ti, "attempt": attempt,
                        "rank": ri, "node": oi, "step": si, "kind": kind,
                        "name": ni, "value": vi, "device": device})
        read += end - start
        last = base + idx[end - 1]
        if read >= limit:
            break
    return last


def named_points(rows: Iterator[tuple], since: int, newest: int, wanted: Iterable[str],
                 latest: Iterable[str] = ()) -> list[tuple]:
    """[(seq, name, t, rank, value, device)...] of chunk rows (seq, device, names, top, data,
    lasts) for the points in (since, newest] with a name in `wanted`, and for names in
    `latest` at least each rank's last logged point of each chunk (of a whole chunk inside
    the window, only that one).

    Alerting reads every new point of the metrics its rules name twice a second: a whole
    chunk is read entry by entry, touching only the wanted values. An `is nan` rule and the
    straggler detector judge each series by its latest point alone: of a whole chunk all
    new, those are its `lasts`, and its points are not decoded at all (at 4,096 ranks,
    decoding every node batch for them was most of alerting's cost, benchmarks/HISTORY.md)."""
    out: list[tuple] = []
    latest = frozenset(latest) - frozenset(wanted)
    wanted = frozenset(wanted)
    both = wanted | latest
    # Per name set read in full: an entry's names -> the read ones, and where.
    hits_caches: dict[frozenset, dict[tuple, list[tuple[int, str]]]] = {wanted: {}, both: {}}
    for seq, device, names, top, data, lasts in rows:
        base = seq * CHUNK
        whole_and_new = bool(latest) and since < base and base + top <= newest
        # All of it new, and none of its names read in full: of `latest` names, the lasts alone.
        lasts_only = whole_and_new and wanted.isdisjoint(counts_of(names))
        if lasts_only and lasts is not None:  # noted at ingest: nothing to decode
            out += [(base + p, name, t, rank, _number(value), device)
                    for p, name, t, rank, value in orjson.loads(lasts) if name in latest]
            continue
        d = wirejson.loads(data)
        if type(d) is list:
            if lasts_only:
                _latest_of_whole(out, d, base, latest, device)
            elif whole_and_new:
                _walk_whole(out, d, base, since, newest, wanted, latest, device, hits_caches[wanted])
            else:
                _walk_whole(out, d, base, since, newest, both, frozenset(), device, hits_caches[both])
            continue
        t, _s, n, v, idx, r, _o = decode(names, data)
        out += [(base + p, ni, ti, ri, vi, device) for p, ti, ni, vi, ri in zip(idx, t, n, v, r, strict=True)
                if ni in both and since < base + p <= newest]
    return out


def _walk_whole(out: list, d: list, base: int, since: int, newest: int, every: frozenset,
                last_of: frozenset, device: Any, hits_cache: dict) -> None:
    """`named_points` of a whole chunk, entry by entry, touching only the values read: the
    points in (since, newest] of `every` name, and each rank's last of `last_of` names."""
    pos = base
    for rank, _node, entries in d:
        last: dict[str, tuple[int, dict]] = {}
        for entry in entries:
            values = entry.get("values")
            if not values:
                continue
            keys = tuple(values)
            hits = hits_cache.get(keys)
            if hits is None:
                hits = hits_cache[keys] = [(at, name) for at, name in enumerate(keys) if name in every]
            for at, name in hits:
                if since < pos + at <= newest:
                    out.append((pos + at, name, entry.get("t"), rank, _number(values[name]), device))
            for name in last_of:
                if name in values:
                    last[name] = (pos + keys.index(name), entry)
            pos += len(keys)
        for name, (at, entry) in last.items():
            out.append((at, name, entry.get("t"), rank, _number(entry["values"][name]), device))


def _latest_of_whole(out: list, d: list, base: int, last_of: frozenset, device: Any) -> None:
    """`named_points` of a whole chunk all new, holding none of the names read in full, and
    without `lasts` (written before them): its lasts of the `last_of` names, found as the
    ingest finds them, from each rank's last entry back."""
    pos = base
    for rank, _node, entries in d:
        pos += sum(len(entry.get("values") or ()) for entry in entries)
        out += [(p, name, t, rank, _number(value), device)
                for p, name, t, _rank, value in _lasts_of(rank, entries, pos, False) if name in last_of]


def _number(value: Any) -> float | None:
    """A stored value as a reader gets it: JSON keeps a whole number as one; a column reads floats."""
    return value if value is None or type(value) is float else float(value)


def names_filter(names: tuple) -> tuple[str, list[str]]:
    """The SQL condition (and its parameters) of chunks that may hold one of `names`."""
    return ("(" + " OR ".join(["instr(names, ?) > 0"] * len(names)) + ")",
            [orjson.dumps(str(name)).decode() + ":" for name in names])


def rank_filter(rank: int) -> tuple[str, list[Any]]:
    """The SQL condition (and its parameters) of chunks that hold points of `rank` (`ranks`
    is a JSON list without spaces, as orjson writes it)."""
    return ("instr(',' || substr(ranks, 2, length(ranks) - 2) || ',', ?) > 0", [f",{int(rank)},"])


def migrate_rows(db: sqlite3.Connection) -> int:
    """Turn the one-row-per-point `metrics` table of a data dir written before chunks into
    chunks, in the caller's transaction, and drop it; returns the chunks written.

    Consecutive rows of one (job, attempt, kind, device) become one chunk (the rows of one
    request were written together), whose seq is its first row's seq: a point's new seq is
    then at least its old one, so an old `since` cursor may see some points again but never
    misses one."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'metrics'").fetchone():
        return 0
    cursor = db.execute("SELECT seq, job_id, t, attempt, rank, node, step, kind, name, value,"
                        " device FROM metrics ORDER BY seq")
    cursor.row_factory = None
    written = 0
    group: list[tuple] = []

    def flush() -> None:
        nonlocal written
        if not group:
            return
        first = group[0]
        names: dict[str, int] = {}
        cols = {"t": [row[2] for row in group], "s": [row[6] for row in group],
                "k": [names.setdefault(row[8], len(names)) for row in group],
                "v": [_finite(row[9]) for row in group], "r": [row[4] for row in group],
                "o": [row[5] for row in group]}
        row = chunk_row((first[1], first[3], first[7], first[10]), list(names), cols)
        db.execute(f"INSERT INTO metric_chunks (seq, {_COLUMNS}) VALUES (?, {_PLACES})", (first[0], *row))
        written += 1
        group.clear()

    for row in cursor:
        if group and (len(group) >= CHUNK or (row[1], row[3], row[7], row[10]) !=
                      (group[0][1], group[0][3], group[0][7], group[0][10])):
            flush()
        group.append(row)
    flush()
    db.execute("DROP TABLE metrics")
    return written
