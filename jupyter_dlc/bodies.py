"""The request bodies besides the spec, as JSON Schemas, and the one checker that enforces them.

The same schemas are served in the OpenAPI document (jupyter_dlc/launcher/openapi.py), so what the
document promises and what the launcher accepts cannot drift apart. The checker knows only the
keywords used here (type, enum, bounds, lengths, properties, required, additionalProperties,
anyOf); `check_schema_keywords` in the tests keeps it that way.
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import wirejson
from .spec import (DOUBLE_MAX, FINITE_SCHEMA, MAX_PATH, MAX_TEXT, SURROGATE, SpecError, is_finite,
                    require_unicode, show)

INT64 = 2**63 - 1
# A step is a JSON number every reader takes exactly: JavaScript's (the panel's) and a
# double's integers end at 2^53; a step past it is no count of optimizer steps.
STEP_MAX = 2**53
SECONDS_MAX = 366 * 86400.0
KNOWN_KEYWORDS = {"type", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength",
                  "maxLength", "maxItems", "maxProperties", "items", "properties", "required",
                  "additionalProperties", "anyOf", "description"}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


STEP = {"type": "integer", "minimum": 0, "maximum": STEP_MAX}
TIME = {"type": "number", "minimum": 0, "maximum": 1e11, "description": "seconds since the epoch"}
NAME = {"type": "string", "minLength": 1, "maxLength": 255}
FINITE = FINITE_SCHEMA  # a value of 10**400 was stored as null: refused, as inf is
SCALAR = {"anyOf": [{"type": "string", "maxLength": MAX_TEXT}, FINITE,
                    {"type": "boolean"}, {"type": "null"}]}
VALUES = {"type": "object", "maxProperties": 256, "additionalProperties": FINITE,
          "description": "metric name → finite number"}
MAX_ENTRIES = 5000

RANK_REPORT: dict[str, Any] = {
    "type": "object",
    "description": "What a rank's runtime posts: identity, metric and system samples, events.",
    "properties": {
        "rank": {"type": "integer", "minimum": 0, "maximum": 1 << 20,
                 "description": "a rank of the job's world (0 to nodes x nproc_per_node - 1)"},
        "node": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
        "attempt": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 30}),
        "pid": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 32}),
        "t": TIME,
        "n": {"type": "integer", "minimum": 0, "maximum": INT64,
              "description": "the sending process's batch number: a batch sent again after a "
                             "lost answer carries the same one, and is stored once"},
        "metrics": {"type": "array", "maxItems": MAX_ENTRIES, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"t": TIME, "step": nullable(STEP), "values": VALUES}}},
        "system": {"type": "array", "maxItems": MAX_ENTRIES, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"t": TIME, "device": nullable(NAME), "values": VALUES}}},
        "events": {"type": "array", "maxItems": MAX_ENTRIES, "items": {
            "type": "object", "required": ["type"], "maxProperties": 64,
            # Events carry their own fields (a checkpoint's path, a NaN's metric name): any
            # flat scalar is stored, the fields the launcher reads are typed.
            "additionalProperties": SCALAR,
            "properties": {
                "type": {"type": "string", "minLength": 1, "maxLength": 64},
                "t": TIME, "step": nullable(STEP),
                "path": nullable({"type": "string", "maxLength": MAX_PATH}),
                "size": nullable({"type": "integer", "minimum": 0, "maximum": INT64}),
                "world_size": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 20}),
                "seconds": nullable({"type": "number", "minimum": 0, "maximum": DOUBLE_MAX}),
                "message": nullable({"type": "string", "maxLength": MAX_TEXT}),
                "error": nullable({"type": "string", "maxLength": MAX_TEXT}),
                # A rank's own records (`rank_start`, `rank_end`, `rank_error`; layout.py).
                "pid": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 32}),
                "node": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
                "local_rank": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
                "start": nullable(TIME), "end": nullable(TIME),
                "exit_code": nullable({"type": "integer", "minimum": -255, "maximum": 255}),
                "traceback": nullable({"type": "string", "maxLength": MAX_TEXT}),
                # `node_exit`: the engine job (a Slurm job id) whose node task exited.
                "engine_id": nullable({"type": "string", "maxLength": 64}),
                # `stacks`, a rank's answer to a suspected hang (runtime/stacks.py).
                "main": nullable({"type": "string", "maxLength": MAX_TEXT}),
                "threads": nullable({"type": "string", "maxLength": MAX_TEXT}),
                # with them, the NCCL flight recorder's dump where the rank runs NCCL
                "nccl": nullable({"type": "string", "maxLength": MAX_TEXT})}}},
    },
    # A newer runtime may send more identity fields; flat scalars are accepted and ignored.
    "additionalProperties": SCALAR,
}
MAX_RANKS_PER_BATCH = 1024
# One node's reporter (runtime/node/reporter.py) sends its ranks' reports in one body: the
# node's identity on top, each rank's report (the rank form above) under "ranks".
REPORT = {**RANK_REPORT,
          "description": "A rank's report, or a node's batch of its ranks' reports under "
                         "`ranks` (then without metrics, system or events of its own).",
          "properties": {**RANK_REPORT["properties"],
                         "ranks": {"type": "array", "maxItems": MAX_RANKS_PER_BATCH,
                                   "items": RANK_REPORT}}}

# What a node without the launcher's filesystem sends of its logs (node/slurm_node.py):
# new lines of its ranks' logs and of its agent's, appended to the attempt's files.
NODE_LOG_BYTES = 1 << 20  # text in one body, all entries together
NODE_LOGS = {
    "type": "object", "additionalProperties": False, "required": ["attempt", "node", "logs"],
    "description": "New lines of one node's logs: `rank` null is the node's own (node-K.log).",
    "properties": {
        "attempt": {"type": "integer", "minimum": 1, "maximum": 1 << 30},
        "node": {"type": "integer", "minimum": 0, "maximum": 1 << 20},
        "logs": {"type": "array", "maxItems": 4096, "items": {
            "type": "object", "additionalProperties": False, "required": ["text"],
            "properties": {"rank": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
                           "text": {"type": "string", "maxLength": NODE_LOG_BYTES}}}}}}

STOP = {"type": "object", "additionalProperties": False, "properties": {
    "grace": nullable({"type": "number", "minimum": 0, "maximum": SECONDS_MAX,
                       "description": "seconds between SIGTERM and SIGKILL"})}}
RESUME = {"type": "object", "additionalProperties": False, "properties": {
    "step": nullable(dict(STEP, description="a committed step; default: the newest"))}}
EMPTY = {"type": "object", "additionalProperties": False, "properties": {}}
_SHAPE = {"type": "integer", "minimum": 1, "maximum": 1 << 16}
_CLUSTER = {"type": "string", "minLength": 1, "maxLength": 63,
            "description": "a cluster profile name; default: this machine"}
POOL_UP = {"type": "object", "additionalProperties": False, "required": ["nodes", "nproc_per_node"],
           "properties": {
               "nodes": _SHAPE, "nproc_per_node": _SHAPE, "cluster": nullable(_CLUSTER),
               "idle_timeout": nullable({"type": "number", "minimum": 1, "maximum": SECONDS_MAX,
                                         "description": "seconds idle before the pool is released"})}}
POOL_DOWN = {"type": "object", "additionalProperties": False,
             "description": "Release the pools that match; all of them when no field is given.",
             "properties": {"nodes": nullable(_SHAPE), "nproc_per_node": nullable(_SHAPE),
                            "cluster": nullable(_CLUSTER)}}

_PY_TYPES: dict[str, Any] = {"integer": int, "number": (int, float), "string": str, "boolean": bool,
             "null": type(None), "object": dict, "array": list}
_WORDS = {"integer": "a whole number", "number": "a finite number", "string": "a string",
          "boolean": "true or false", "null": "null", "object": "an object", "array": "a list"}


def check(value: Any, schema: dict, where: str) -> None:
    """Raise SpecError(where, ...) unless `value` matches `schema`."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                check(value, option, where)
                return
            except SpecError as error:
                errors.append(error)
        # The first option is the meaningful one; the others are null or fallbacks.
        raise errors[0]
    kind = schema["type"]
    if isinstance(value, bool) != (kind == "boolean") or not isinstance(value, _PY_TYPES[kind]) \
            or (kind == "number" and not is_finite(value)):
        raise SpecError(where, f"expected {_WORDS[kind]}, got {show(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise SpecError(where, f"expected one of {', '.join(map(str, schema['enum']))}, got {show(value)}")
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high) or \
                ("exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]):
            raise SpecError(where, f"{show(value)} is out of range "
                                   f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]")
    elif kind == "string":
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 62):
            raise SpecError(where, f"length {len(value)} is outside {schema.get('minLength', 0)}.."
                                   f"{schema.get('maxLength')}")
    elif kind == "array":
        if len(value) > schema.get("maxItems", 1 << 62):
            raise SpecError(where, f"{len(value)} items; at most {schema['maxItems']} are allowed")
        for index, item in enumerate(value):
            check(item, schema.get("items", {"anyOf": [{"type": t} for t in _PY_TYPES]}),
                  f"{where}[{index}]")
    elif kind == "object":
        _check_object(value, schema, where)


def _check_object(value: dict, schema: dict, where: str) -> None:
    if len(value) > schema.get("maxProperties", 1 << 62):
        raise SpecError(where, f"{len(value)} fields; at most {schema['maxProperties']} are allowed")
    for name in schema.get("required", ()):
        if name not in value:
            raise SpecError(f"{where}.{name}" if where else name, "is required")
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        path = f"{where}.{name}" if where else name
        if name in properties:
            check(item, properties[name], path)
        elif extra is False:
            raise SpecError(path, f"unknown field; known fields are {', '.join(properties) or 'none'}")
        elif isinstance(extra, dict):
            check(item, extra, path)


def parse_body(raw: bytes, schema: dict | None = None, world: int | None = None) -> dict:
    """A request body: JSON, an object, checked against `schema`; SpecError otherwise. Every
    body of every route comes through here (a report through the ingest worker, with its
    job's `world`), so none holds a string that is not valid Unicode."""
    if not raw.strip():
        raise SpecError("body", "empty; send a JSON object ({} at the least)")
    try:
        # A node's batch is megabytes a second. NaN tokens and the like are parsed (by
        # json), so that the checks below name the field, as for every body.
        data, strict = wirejson.parse(raw)
        if not strict:  # only json's documents can hold a lone surrogate (wirejson.parse)
            check_unicode(data)
    except RecursionError:
        raise SpecError("body", "JSON nested too deeply") from None
    except SpecError:
        raise
    except ValueError:
        raise SpecError("body", "not valid JSON (UTF-8)") from None
    if schema is REPORT:
        return check_report(data, world)
    return check_body(data, schema or {"type": "object"})


def check_unicode(value: Any) -> None:
    """SpecError naming the first string or name in `value` that is not valid Unicode
    (spec.require_unicode, as the spec's text fields). One C pass tells whether there is
    any; only then is it looked for field by field, for the name."""
    if not SURROGATE.search(json.dumps(value, ensure_ascii=False)):
        return
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if type(item) is str:
            require_unicode(item, where or "body")
        elif type(item) is dict:
            for key, sub in reversed(item.items()):
                require_unicode(key, where or "body", key=True)
                stack.append((sub, f"{where}.{key}" if where else key))
        elif type(item) is list:
            stack.extend((sub, f"{where}[{index}]") for index, sub in reversed(list(enumerate(item))))


def check_report(value: Any, world: int | None = None) -> dict:
    """A report or a node batch, checked as `REPORT`, each rank in a `world` of that many
    ranks when it is given. Metric and system samples are almost all of a report: a fast
    test of their usual shape passes them, and only what it does not pass goes through the
    generic checker (which then names the field)."""
    if not isinstance(value, dict):
        raise SpecError("body", "expected a JSON object")
    _check_rank_report(value, "", world)
    ranks = value.get("ranks")
    if ranks is not None:
        if not isinstance(ranks, list) or len(ranks) > MAX_RANKS_PER_BATCH:
            check(ranks, REPORT["properties"]["ranks"], "ranks")
        own = [kind for kind in ("metrics", "system", "events") if value.get(kind)]
        if own:
            raise SpecError(own[0], "a node batch carries data only per rank; move it into "
                                    "the rank's entry under ranks")
        for index, report in enumerate(ranks):
            if not isinstance(report, dict):
                raise SpecError(f"ranks[{index}]", f"expected an object, got {show(report)}")
            if "ranks" in report:
                raise SpecError(f"ranks[{index}].ranks", "a rank's report cannot hold ranks")
            _check_rank_report(report, f"ranks[{index}]", world)
    return value


# The identity fields every report carries: (lowest, highest, whether null is allowed).
_IDENTITY = {"rank": (0, 1 << 20, False), "node": (0, 1 << 20, True),
             "attempt": (1, 1 << 30, True), "pid": (1, 1 << 32, True)}


def _check_rank_report(report: dict, where: str, world: int | None) -> None:
    if not _head_ok(report):
        head = {k: v for k, v in report.items() if k not in ("metrics", "system", "ranks")}
        check(head, RANK_REPORT, where)
    rank = report.get("rank", 0)
    if world is not None and rank >= world:
        # Stored, it would be a rank row no view shows and a heartbeat of nobody.
        raise SpecError(f"{where}.rank" if where else "rank",
                        f"rank {rank} does not exist in a world of {world} (ranks 0-{world - 1})")
    for kind, label in (("metrics", "step"), ("system", "device")):
        if kind in report and not _samples_ok(report[kind], label):
            check(report[kind], RANK_REPORT["properties"][kind], f"{where}.{kind}" if where else kind)


def _head_ok(report: dict) -> bool:
    """The usual identity fields and no events; anything else goes to the generic checker."""
    for key, item in report.items():
        bounds = _IDENTITY.get(key)
        if bounds is not None:
            if item is None and bounds[2]:
                continue
            if type(item) is not int or not bounds[0] <= item <= bounds[1]:
                return False
        elif key == "t":
            if type(item) not in (int, float) or not 0 <= item <= 1e11:
                return False
        elif key == "events":
            if item != []:
                return False
        elif key not in ("metrics", "system", "ranks"):
            return False
    return True


def _samples_ok(entries: Any, label: str) -> bool:
    """True only for what the generic checker accepts too (see check_report)."""
    if type(entries) is not list or len(entries) > MAX_ENTRIES:
        return False
    for entry in entries:
        if type(entry) is not dict:
            return False
        for key, item in entry.items():
            if key == "values":
                if type(item) is not dict or len(item) > 256:
                    return False
                for number in item.values():
                    kind = type(number)
                    if not ((kind is float and math.isfinite(number))
                            or (kind is int and -DOUBLE_MAX <= number <= DOUBLE_MAX)):
                        return False
            elif key == "t":
                if type(item) not in (int, float) or not 0 <= item <= 1e11:
                    return False
            elif key != label:
                return False
            elif item is None:
                continue
            elif label == "step":
                if type(item) is not int or not 0 <= item <= STEP_MAX:
                    return False
            elif type(item) is not str or not 1 <= len(item) <= 255:
                return False
    return True


def check_body(value: Any, schema: dict) -> dict:
    """A request body (already parsed JSON) checked against `schema`; returns it."""
    if not isinstance(value, dict):
        raise SpecError("body", "expected a JSON object")
    check(value, schema, "")
    return value
