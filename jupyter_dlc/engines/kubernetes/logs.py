"""Incremental reads of a pod's log: only what is new since the last read.

The pod log API has no byte offset. It has `timestamps=true` (each line prefixed with its
RFC3339Nano time) and `sinceTime` (whole seconds), so a read asks for the lines since the
second of the last line taken, and drops those up to it: those with an earlier time, and as
many with exactly its time as were taken already (lines can share a time). Once that second
is SETTLED seconds past, the read starts at the next one: a pod gone quiet costs empty
answers, not its last second again and again. The cursor per pod
is kept in the attempt directory (`pod-log-cursors.json`), so a restarted launcher goes on
where the last one stopped instead of copying every log again.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from collections.abc import Callable

from ... import layout

CURSORS = "pod-log-cursors.json"
# Seconds after which no more lines stamped with a given second can appear: the kubelet
# stamps a line as it takes it, so only clock skew between node and launcher is covered.
SETTLED = 10.0


def parse_time(stamp: str) -> tuple[str, int]:
    """(the whole second, "YYYY-MM-DDTHH:MM:SS", nanoseconds) of an RFC3339(Nano) UTC time;
    the API trims trailing zeros of the fraction, so the text alone does not sort."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return whole, int((fraction + "000000000")[:9]) if fraction else 0


def new_lines(fetch: Callable[[str | None], str], cursor: dict | None,
              now: float | None = None) -> tuple[list[str], dict | None]:
    """The complete lines a pod logged after `cursor` ({"time", "seen"} or None: from the
    start), and the cursor after them. `fetch(since_time)` asks the log API with
    timestamps=true and sinceTime=since_time (None: the whole log)."""
    since = None
    if cursor:
        second = parse_time(cursor["time"])[0]
        start = calendar.timegm(time.strptime(second, "%Y-%m-%dT%H:%M:%S"))
        if (now if now is not None else time.time()) - start > SETTLED:
            # That second is long over: every line of it is in the log, and taken.
            second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + 1))
        since = second + "Z"
    text = fetch(since)
    complete = text[:text.rfind("\n") + 1]  # a line still being written comes next time
    last = parse_time(cursor["time"]) if cursor else None
    skip = cursor["seen"] if cursor else 0
    out: list[str] = []
    stamped: list[tuple[tuple[str, int], str]] = []
    for raw in complete.splitlines():
        stamp, _, line = raw.partition(" ")
        try:
            when = parse_time(stamp)
        except ValueError:  # not a timestamp: keep the line, it moves no cursor
            out.append(raw)
            continue
        stamped.append((when, stamp))
        if last is not None and (when < last or (when == last and skip)):
            skip -= when == last
            continue
        out.append(line)
    if not stamped:
        return out, cursor
    newest, stamp = stamped[-1]
    # Every fetched line with the newest time is taken by now (in this read or before).
    return out, {"time": stamp, "seen": sum(1 for when, _ in stamped if when == newest)}


def load_cursors(attempt_dir: str) -> dict[str, dict]:
    try:
        with open(os.path.join(attempt_dir, CURSORS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_cursors(attempt_dir: str, cursors: dict[str, dict]) -> None:
    os.makedirs(attempt_dir, exist_ok=True)
    path = os.path.join(attempt_dir, CURSORS)
    layout.write_json(path, cursors)
