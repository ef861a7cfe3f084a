"""How the launcher's answers are encoded: JSON, in C where every number is finite, with NaN
and Infinity sent as strings (JSON has neither) so that every client can parse a body."""

from __future__ import annotations

import json
import math
from typing import Any

_INFINITE = (math.inf, -math.inf)


def _json_default(value: Any) -> Any:
    return str(value)


def encode(data: Any) -> str:
    """An answer as JSON. Encoded in C when every number is finite (a job's detail with
    thousands of ranks: walking it in Python first cost more than the encoding)."""
    try:
        return json.dumps(data, allow_nan=False, default=_json_default)
    except ValueError:
        return json.dumps(_clean(data), default=_json_default)


def _clean(value: Any) -> Any:
    """JSON has no NaN or Infinity; send them as strings so every client can parse the body."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
