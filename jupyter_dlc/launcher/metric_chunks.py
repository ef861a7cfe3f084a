"""Metric points stored in chunks: one SQLite row per rank report, kind and device.

4,096 ranks logging 2 values 10 times a second are 81,920 points a second. As one row per
point, SQLite's per-row insert (and Python's 10-tuple per point) cost about 0.3 s of CPU per
second of that load, the launcher's largest single cost. So the train entries of one rank
report are one chunk, and its system entries one chunk per device; `data` holds the points
as compact JSON (orjson, in C): while a chunk is whole, the entries as the rank posted them
(`[{"t", "step", "values": {name: value}}...]`: storing them costs one C call, not Python
work per point); once retention rewrote it (or a data dir written before chunks was
migrated), columns `{"t", "s" (train only), "k" (index into `names`), "v", "i"}`, `i` being
each survivor's original index. A value reads back as a float, NaN as None (what SQLite did
with a NaN REAL), +-inf as floats (such a chunk is written by the standard library, as
JSON's Infinity, since orjson writes null).

`names` is {name: points in the chunk} in compact JSON, so that a reader wanting only `loss`
skips a chunk in SQL (`instr(names, '"loss":')`, then an exact test on what it decodes), and
retention counts a series' points without decoding. `top` is the index of the chunk's last
point; `n`, `t_first`, `t_last`, `step_max` let readers and retention skip chunks unread.

On the wire a point keeps a seq as before: `chunk seq * CHUNK + index` (a chunk holds at most
CHUNK points; a larger report is split), unique and increasing, and stable when retention
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

CHUNK = 4096

SCHEMA = """
CREATE TABLE IF NOT EXISTS metric_chunks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, attempt INTEGER, rank INTEGER,
    node INTEGER, kind TEXT NOT NULL, device TEXT, names TEXT NOT NULL, n INTEGER NOT NULL,
    top INTEGER NOT NULL, t_first REAL, t_last REAL, step_max INTEGER, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS metric_chunks_job ON metric_chunks (job_id, seq);
"""
_COLUMNS = "job_id, attempt, rank, node, kind, device, names, n, top, t_first, t_last, step_max, data"
INSERT = f"INSERT INTO metric_chunks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# What a reader of points selects, in the order `read_points` takes it.
POINT_COLUMNS = "seq, job_id, attempt, rank, node, kind, device, names, top, data"
# A point as every reader returns it: the columns of the one-row-per-point table it replaces.
POINT_KEYS = ("seq", "job_id", "t", "attempt", "rank", "node", "step", "kind", "name", "value", "device")

# orjson writes a non-finite float as null: a chunk holding +-inf is written by the
# standard library (as Infinity), which also reads what orjson cannot.
_dumps_any = json.JSONEncoder(separators=(",", ":")).encode


def _loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@functools.lru_cache(maxsize=4096)
def names_of(text: str) -> tuple[str, ...]:
    """A chunk's names in index order (a few distinct `names` texts recur in every chunk)."""
    return tuple(orjson.loads(text))


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if number != number else number


@functools.lru_cache(maxsize=4096)
def counts_of(text: str) -> dict[str, int]:
    """A chunk's {name: points} (do not change the answer: it is shared)."""
    return orjson.loads(text)


def _all_finite(values: list) -> bool:
    return math.isfinite(sum(v for v in values if v is not None))


def report_chunks(rows: list, job_id: str, attempt: int, rank: int, report: dict,
                  now: float) -> tuple[int | None, tuple[float | None] | None]:
    """Append the chunk rows (INSERT's order) of one rank report; returns its last step and
    (its last loss,).

    Runs for every report of every rank: per entry only what the row needs (last step, point
    count, names), no work per point; the entries are written as they came."""
    node = report.get("node")
    last_step = None
    loss = None
    entries = report.get("metrics")
    if entries:
        n = 0
        first = None
        uniform = True
        usual = True  # numbers, finite, with their time: the entries can be written as they are
        with_values = 0
        for entry in entries:
            step = entry.get("step")
            if step is not None and (last_step is None or step > last_step):
                last_step = step
            values = entry.get("values")
            if values:
                n += len(values)
                with_values += 1
                if first is None:
                    first = values.keys()
                elif uniform and values.keys() != first:
                    uniform = False
                if "loss" in values:
                    loss = (values["loss"],)
                if usual:
                    try:
                        usual = "t" in entry and math.isfinite(sum(values.values()))
                    except (TypeError, OverflowError):
                        usual = False
        if n:
            head = (job_id, attempt, rank, node, "train", None)
            written = False
            if usual and n <= CHUNK:
                counts = dict.fromkeys(first, with_values) if uniform else \
                    collections.Counter(k for entry in entries for k in entry.get("values") or ())
                try:
                    times = [entry["t"] for entry in entries]
                    rows.append((*head, orjson.dumps(counts).decode(), n, n - 1, min(times),
                                 max(times), last_step, orjson.dumps(entries)))
                    written = True
                except TypeError:  # a name, number or time orjson cannot write (direct callers)
                    pass
            if not written:
                _append_unusual(rows, head, entries, now, True)
        if loss is not None:
            loss = (_finite(loss[0]),)
    system = report.get("system")
    if system:
        devices: dict[Any, list] = {}
        for entry in system:
            if entry.get("values"):
                devices.setdefault(entry.get("device"), []).append(entry)
        for device, own in devices.items():
            _append_unusual(rows, (job_id, attempt, rank, node, "system", device), own, now, False)
    return last_step, loss


def _append_unusual(rows: list, head: tuple, entries: list, now: float, train: bool) -> None:
    """Entries written through Python (system entries; train entries with more than CHUNK
    points, a missing time or a value that is not a finite number), as columns."""
    names: dict[str, int] = {}
    t_col: list = []
    s_col: list = []
    k_col: list = []
    v_col: list = []
    for entry in entries:
        t = _finite(entry.get("t", now))
        step = entry.get("step")
        for name, value in (entry.get("values") or {}).items():
            if len(v_col) == CHUNK:
                rows.append(chunk_row(head, list(names), t_col, s_col if train else None, k_col, v_col, None))
                names, t_col, s_col, k_col, v_col = {}, [], [], [], []
            t_col.append(t)
            s_col.append(step)
            k_col.append(names.setdefault(str(name), len(names)))
            v_col.append(_finite(value) if type(value) is not float else value)
    if v_col:
        rows.append(chunk_row(head, list(names), t_col, s_col if train else None, k_col, v_col, None))


def chunk_row(head: tuple, names: list, t_col: list, s_col: list | None, k_col: list,
              v_col: list, i_col: list | None) -> tuple:
    """A columns chunk's row for INSERT after `head` (job_id, attempt, rank, node, kind,
    device); values are floats or None (NaN)."""
    v_col = [None if v != v else v for v in v_col]
    counts = [0] * len(names)
    for k in k_col:
        counts[k] += 1
    data: dict[str, list] = {"t": t_col, "k": k_col, "v": v_col}
    step_max = None
    if s_col is not None:
        data["s"] = s_col
        steps = [s for s in s_col if s is not None]
        step_max = max(steps) if steps else None
    if i_col is not None:
        data["i"] = i_col
    times = [t for t in t_col if t is not None]
    return (*head, orjson.dumps(dict(zip(names, counts, strict=True))).decode(), len(v_col),
            i_col[-1] if i_col is not None else len(v_col) - 1, min(times, default=None),
            max(times, default=None), step_max,
            orjson.dumps(data) if _all_finite(v_col) else _dumps_any(data))


def decode(names: str, data: bytes | str) -> tuple[list, list, list, list, Any]:
    """The points of a chunk as columns: (t, step, name, value, original index: a list, or a
    range while the chunk is whole)."""
    d = _loads(data)
    if type(d) is list:  # whole: the entries as posted
        t_col: list = []
        s_col: list = []
        n_col: list = []
        v_col: list = []
        for entry in d:
            values = entry.get("values")
            if values:
                count = len(values)
                t_col += [entry.get("t")] * count
                s_col += [entry.get("step")] * count
                n_col += values
                v_col += values.values()
        # JSON keeps a whole number as one; the column read back floats
        return t_col, s_col, n_col, [v if v is None or type(v) is float else float(v) for v in v_col], \
            range(len(v_col))
    v = d["v"]
    labels = names_of(names)
    return d["t"], d.get("s") or [None] * len(v), [labels[k] for k in d["k"]], v, d.get("i") or range(len(v))


def read_points(out: list, rows: Iterator[tuple], since: int, limit: int) -> None:
    """Append to `out`, as dicts, the points after `since` of chunk rows (POINT_COLUMNS, in
    seq order) until `out` holds `limit` points."""
    for seq, job_id, attempt, rank, node, kind, device, names, top, data in rows:
        base = seq * CHUNK
        if base + top <= since:
            continue
        t, s, n, v, idx = decode(names, data)
        start = bisect_right(idx, since - base) if since >= base else 0
        end = min(len(v), start + limit - len(out))
        for p, ti, si, ni, vi in zip(idx[start:end], t[start:end], s[start:end], n[start:end],
                                     v[start:end], strict=True):
            out.append({"seq": base + p, "job_id": job_id, "t": ti, "attempt": attempt,
                        "rank": rank, "node": node, "step": si, "kind": kind,
                        "name": ni, "value": vi, "device": device})
        if len(out) >= limit:
            return


def named_points(rows: Iterator[tuple], since: int, newest: int, wanted: Iterable[str]) -> list[tuple]:
    """[(seq, name, t, rank, value, device)...] of chunk rows (seq, rank, device, names, data)
    for the points in (since, newest] with a name in `wanted`.

    Alerting reads every new point of the metrics its rules name twice a second: a whole
    chunk is read entry by entry, touching only the wanted values."""
    out: list[tuple] = []
    wanted = frozenset(wanted)
    for seq, rank, device, names, data in rows:
        base = seq * CHUNK
        d = _loads(data)
        if type(d) is list:
            pos = base
            for entry in d:
                values = entry.get("values")
                if not values:
                    continue
                hit = wanted.intersection(values)
                if hit:
                    keys = list(values)
                    for at, name in sorted((keys.index(name), name) for name in hit):
                        value = values[name]
                        if since < pos + at <= newest:
                            out.append((pos + at, name, entry.get("t"), rank,
                                        value if value is None or type(value) is float else float(value),
                                        device))
                pos += len(values)
            continue
        t, _s, n, v, idx = decode(names, data)
        out += [(base + p, ni, ti, rank, vi, device) for p, ti, ni, vi in zip(idx, t, n, v, strict=True)
                if ni in wanted and since < base + p <= newest]
    return out


def names_filter(names: tuple) -> tuple[str, list[str]]:
    """The SQL condition (and its parameters) of chunks that may hold one of `names`."""
    return ("(" + " OR ".join(["instr(names, ?) > 0"] * len(names)) + ")",
            [orjson.dumps(str(name)).decode() + ":" for name in names])


def migrate_rows(db: sqlite3.Connection) -> int:
    """Turn the one-row-per-point `metrics` table of a data dir written before chunks into
    chunks, in the caller's transaction, and drop it; returns the chunks written.

    Consecutive rows of one (job, attempt, rank, node, kind, device) become one chunk (the
    rows of one report were written together), whose seq is its first row's seq: a point's
    new seq is then at least its old one, so an old `since` cursor may see some points again
    but never misses one."""
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
        head = (first[1], first[3], first[4], first[5], first[7], first[10])
        names: dict[str, int] = {}
        k_col = [names.setdefault(row[8], len(names)) for row in group]
        train = first[7] == "train"
        row = chunk_row(head, list(names), [row[2] for row in group],
                        [row[6] for row in group] if train else None, k_col,
                        [row[9] for row in group], None)
        db.execute(f"INSERT INTO metric_chunks (seq, {_COLUMNS}) VALUES"
                   " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (first[0], *row))
        written += 1
        group.clear()

    for row in cursor:
        key = (row[1], row[3], row[4], row[5], row[7], row[10])
        if group and (len(group) >= CHUNK or key != (group[0][1], group[0][3], group[0][4],
                                                        group[0][5], group[0][7], group[0][10])):
            flush()
        group.append(row)
    flush()
    db.execute("DROP TABLE metrics")
    return written
