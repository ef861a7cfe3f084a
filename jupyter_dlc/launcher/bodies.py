"""The request bodies besides the spec, as JSON Schemas, and the one checker that enforces them.

The same schemas are served in the OpenAPI document (jupyter_dlc/openapi.py), so what the
document promises and what the launcher accepts cannot drift apart. The checker knows only the
keywords used here (type, enum, bounds, lengths, properties, required, additionalProperties,
anyOf); `check_schema_keywords` in the tests keeps it that way.
"""

from __future__ import annotations

import math
from typing import Any

from ..spec import MAX_PATH, MAX_TEXT, SpecError, show

INT64 = 2**63 - 1
SECONDS_MAX = 366 * 86400.0
KNOWN_KEYWORDS = {"type", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength",
                  "maxLength", "maxItems", "maxProperties", "items", "properties", "required",
                  "additionalProperties", "anyOf", "description"}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


STEP = {"type": "integer", "minimum": 0, "maximum": INT64}
TIME = {"type": "number", "minimum": 0, "maximum": 1e11, "description": "seconds since the epoch"}
NAME = {"type": "string", "minLength": 1, "maxLength": 255}
SCALAR = {"anyOf": [{"type": "string", "maxLength": MAX_TEXT}, {"type": "number"},
                    {"type": "boolean"}, {"type": "null"}]}
VALUES = {"type": "object", "maxProperties": 256, "additionalProperties": {"type": "number"},
          "description": "metric name → finite number"}
MAX_ENTRIES = 5000

REPORT = {
    "type": "object",
    "description": "What a rank's runtime posts: identity, metric and system samples, events.",
    "properties": {
        "rank": {"type": "integer", "minimum": 0, "maximum": 1 << 20},
        "node": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
        "attempt": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 30}),
        "pid": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 32}),
        "t": TIME,
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
                "seconds": nullable({"type": "number", "minimum": 0}),
                "message": nullable({"type": "string", "maxLength": MAX_TEXT}),
                "error": nullable({"type": "string", "maxLength": MAX_TEXT}),
                # A rank's own records (`rank_start`, `rank_end`, `rank_error`; layout.py).
                "pid": nullable({"type": "integer", "minimum": 1, "maximum": 1 << 32}),
                "node": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
                "local_rank": nullable({"type": "integer", "minimum": 0, "maximum": 1 << 20}),
                "start": nullable(TIME), "end": nullable(TIME),
                "exit_code": nullable({"type": "integer", "minimum": -255, "maximum": 255}),
                "traceback": nullable({"type": "string", "maxLength": MAX_TEXT})}}},
    },
    # A newer runtime may send more identity fields; flat scalars are accepted and ignored.
    "additionalProperties": SCALAR,
}

STOP = {"type": "object", "additionalProperties": False, "properties": {
    "grace": nullable({"type": "number", "minimum": 0, "maximum": SECONDS_MAX,
                       "description": "seconds between SIGTERM and SIGKILL"})}}
RESUME = {"type": "object", "additionalProperties": False, "properties": {
    "step": nullable(dict(STEP, description="a committed step; default: the newest"))}}
EMPTY = {"type": "object", "additionalProperties": False, "properties": {}}

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
            or (kind == "number" and isinstance(value, float) and not math.isfinite(value)):
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


def check_body(value: Any, schema: dict) -> dict:
    """A request body (already parsed JSON) checked against `schema`; returns it."""
    if not isinstance(value, dict):
        raise SpecError("body", "expected a JSON object")
    check(value, schema, "")
    return value
