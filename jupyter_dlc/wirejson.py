"""JSON on the wire through orjson. Parsed: two to three times json's speed on reports and
metrics answers; what orjson refuses and json takes (NaN and Infinity tokens, integers past
a double's range, nesting past 1,024 levels, lone UTF-16 surrogates such as "\\ud800") goes
through json, so both read the same documents. Written (`dumps`, a rank's reports): a tenth
of json's time, which a rank's training thread would otherwise wait for (the GIL)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(raw: bytes | bytearray | str) -> Any:
    return parse(raw)[0]


def dumps(document: Any, default: Any = None) -> bytes:
    """`json.dumps(document, allow_nan=False, default=default).encode()`, by orjson. What
    orjson refuses (keys that are not strings, integers past 64 bits, what `default` cannot
    turn into JSON) goes through json, which writes the first two and raises for the last.
    Unlike json, orjson writes a NaN or an infinity as null instead of refusing the whole
    document: the runtime sends none of its own (log() keeps them out of its metrics)."""
    try:
        return orjson.dumps(document, default=default)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(document, allow_nan=False, default=default).encode()


def parse(raw: bytes | bytearray | str) -> tuple[Any, bool]:
    """(the document, whether orjson read it). orjson refuses a lone surrogate, so only what
    json read can hold one: a caller checks the strings of those documents alone (rare: the
    runtime never sends one), and the usual ones cost nothing more."""
    try:
        return orjson.loads(raw), True
    except orjson.JSONDecodeError:
        return json.loads(raw), False


# Entries of containers that one json.dumps call of `dumps_in_slices` encodes at most.
SLICE_ENTRIES = 512


def dumps_in_slices(document: Any, entries: int = SLICE_ENTRIES) -> str:
    """`json.dumps(document)`, the same text, written by one json.dumps call per slice of at
    most `entries` entries of its containers (dicts, lists; nested ones counted in).

    json's C encoder keeps the GIL for a whole document. The launcher's alert state of a
    4,096-rank job (about 350 KB, a cursor per rank and rule) took 8-24 ms to encode, every
    5 s, and the event loop that answers every node's report could not run meanwhile;
    between two slices it can. Only for large documents: a small one is one call."""
    if _entries(document, entries) <= entries:
        return json.dumps(document)
    if isinstance(document, dict):
        return "{" + _slices(document.items(), True, entries) + "}"
    if isinstance(document, (list, tuple)):
        return "[" + _slices(((None, value) for value in document), False, entries) + "]"
    return json.dumps(document)  # a container json knows and this does not: one call


def _slices(pairs: Any, keyed: bool, entries: int) -> str:
    """The inside of a dict (`keyed`: its (key, value) pairs) or of a list ((None, value)),
    its small members encoded together in slices, a large one in slices of its own."""
    parts: list[str] = []
    batch: list[tuple[Any, Any]] = []
    weight = 0

    def flush() -> None:
        if batch:
            parts.append(json.dumps(dict(batch) if keyed else [v for _, v in batch])[1:-1])
            batch.clear()

    for key, value in pairs:
        size = _entries(value, entries) + 1
        if size > entries:  # too large for any slice: its own slices
            flush()
            weight = 0
            head = json.dumps({key: None})[1:-len(": null}")] + ": " if keyed else ""
            parts.append(head + dumps_in_slices(value, entries))
            continue
        if weight + size > entries:
            flush()
            weight = 0
        batch.append((key, value))
        weight += size
    flush()
    return ", ".join(parts)


def _entries(value: Any, limit: int) -> int:
    """The entries of the containers in `value`, counted until past `limit`."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            if count > limit:
                return count
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            count += len(item)
            if count > limit:
                return count
            stack.extend(item)
    return count
