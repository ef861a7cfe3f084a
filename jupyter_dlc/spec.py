"""JobSpec: what a job is, validated once, with one-line errors that name the field.

The magics, the CLI and the launcher all build jobs through `JobSpec.from_dict`, so a bad
value gets the same message wherever it came from.
"""

from __future__ import annotations

import dataclasses
import warnings
import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import shell
from . import engine_registry

# The engines registered (engine_registry.py, an entry-point group), read when spec is imported.
ENGINES = engine_registry.names()
NETWORKS = ("tcp", "rdma", "debug")

# torchrun and the launcher own these; a user's --env must not break the rendezvous.
RENDEZVOUS_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
     "MASTER_PORT", "DLC_JOB_ID", "DLC_ATTEMPT", "DLC_TOKEN", "DLC_LAUNCHER_URL"}
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

# Limits a spec must stay within; far above any real job, low enough that one request cannot
# make the launcher copy, store or pass to execve more than it can handle.
MAX_DURATION = 366 * 86400.0
MAX_PATH = 4096
MAX_TEXT = 4096
MAX_CODE = 4 << 20
MAX_LIST = 1024
MAX_ENV_VARS = 1024
MAX_ENV_BYTES = 256 << 10
MAX_MEMORY_MB = 1 << 30  # a node's memory: 1 PiB, in megabytes
# The largest finite double: a JSON integer past it (10**400) is no number a view, JavaScript
# or SQLite's REAL can hold (float() of it overflows).
DOUBLE_MAX = sys.float_info.max


def show(value: Any, limit: int = 60) -> str:
    """A value for an error message: repr, cut short, so that a 1 MB input is not echoed."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class SpecError(ValueError):
    """A one-line, user-facing error: `field: what is wrong; how to fix it`."""

    def __init__(self, field_name: str, message: str):
        if len(field_name) > 60 or "\n" in field_name or not_unicode(field_name):
            field_name = show(field_name)[1:-1]  # cut short, escaped: the message is one line of text
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def parse_duration(value: Any, field_name: str) -> float:
    """Seconds from 90, "90", "90s", "15m", "2h", "1d" or "250ms"; finite, positive, at most a year."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecError(field_name, f"expected a duration like 90s, 15m or 2h, got {show(value)}")
    if isinstance(value, int) and abs(value) > MAX_DURATION:
        seconds = math.inf  # float() of a 400-digit int would raise
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(value) if len(value) < 40 else None
        if not match:
            raise SpecError(field_name, f"expected a duration like 90s, 15m or 2h, got {show(value)}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(field_name, f"must be a positive, finite duration, got {show(value)}")
    if seconds > MAX_DURATION:
        raise SpecError(field_name, f"must be at most {format_duration(MAX_DURATION)}, got {show(value)}")
    return seconds


def parse_memory_mb(value: Any, field_name: str) -> int:
    """Megabytes from 2000 (MB), "2000M", "16G", "1T"; at most MAX_MEMORY_MB."""
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    match = re.match(r"^\s*(\d+)\s*([MGT]?)B?\s*$", text, re.IGNORECASE) if len(text) <= 40 else None
    if not match or int(match.group(1)) <= 0:
        raise SpecError(field_name, f"expected a size like 16G or 2000M, got {show(value)}")
    megabytes = int(match.group(1)) * {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    if megabytes > MAX_MEMORY_MB:
        raise SpecError(field_name, f"{show(value)} is more than any node has; at most {MAX_MEMORY_MB >> 20}T")
    return megabytes


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# A code point of the UTF-16 surrogate range. In a Python string decoded from JSON ("\ud800")
# or from argv (os.fsdecode's surrogateescape) one is always lone, since a valid pair decodes
# to one character: it is no text, UTF-8 cannot encode it, and a file name, argv, environ or
# SQLite's TEXT then raises UnicodeEncodeError wherever it arrives.
SURROGATE = re.compile("[\ud800-\udfff]")


def not_unicode(value: str) -> str | None:
    """Why `value` is not valid Unicode text (what is wrong; how to fix it), or None."""
    if value.isascii():
        return None
    found = SURROGATE.search(value)
    if found is None:
        return None
    return (f"holds {show(found.group())} at character {found.start()}, a lone UTF-16 surrogate, "
            "which is not text (UTF-8 cannot encode it); send valid Unicode")


def require_unicode(value: str, field_name: str, key: bool = False) -> None:
    """SpecError unless `value` is valid Unicode text; `key`: it is a name in the mapping that
    `field_name` is. The one test of text before it can reach a file, a shell or the database:
    every text field of the spec (check_text), every request body and rank report
    (bodies.check_unicode)."""
    problem = not_unicode(value)
    if problem:
        raise SpecError(field_name, f"name {show(value)} {problem}" if key else problem)


def is_finite(number: int | float) -> bool:
    """A float that is finite, or an int a double holds (JSON's 1e400 reads as a float, 10**400
    as an int): what every body and spec takes as a number."""
    return math.isfinite(number) if type(number) is float else -DOUBLE_MAX <= number <= DOUBLE_MAX


def check_text(value: Any, field_name: str, limit: int = MAX_TEXT, what: str = "a string",
               key: bool = False) -> str:
    """A string without NUL bytes (no path, argv or environment can hold one) or lone
    surrogates (require_unicode), at most `limit`; `key`: a name in the mapping `field_name`."""
    if not isinstance(value, str):
        raise SpecError(field_name, f"expected {what}, got {show(value)}")
    if "\0" in value:
        raise SpecError(field_name, "contains a NUL byte, which no path, argument or variable can hold")
    if len(value) > limit:
        raise SpecError(field_name, f"is {len(value)} characters long; at most {limit} are allowed")
    require_unicode(value, field_name, key)
    return value


def parse_env(items: list[str] | dict[str, Any] | None, field_name: str = "env") -> dict[str, str]:
    """`["K=V", ...]` or a dict → dict; names checked, rendezvous variables refused."""
    if items is None:
        return {}
    pairs: list[tuple[str, Any]]
    if isinstance(items, dict):
        pairs = list(items.items())
    elif isinstance(items, list):
        pairs = []
        for item in items[:MAX_ENV_VARS + 1]:
            if not isinstance(item, str) or "=" not in item:
                raise SpecError(field_name, f"expected K=V, got {show(item)}; write e.g. --env LR=0.1")
            key, _, value = item.partition("=")
            pairs.append((key.strip(), value))
    else:
        raise SpecError(field_name, f"expected a mapping of NAME to value, got {show(items)}")
    if len(pairs) > MAX_ENV_VARS:
        raise SpecError(field_name, f"{len(items)} variables; at most {MAX_ENV_VARS} are allowed")
    env = {}
    for key, value in pairs:
        if isinstance(key, str):
            require_unicode(key, field_name, key=True)
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise SpecError(field_name, f"{show(key)} is not a valid variable name")
        if key in RENDEZVOUS_VARS:
            raise SpecError(field_name, f"{key} is set by torchrun and the launcher; it cannot be overridden")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SpecError(field_name, f"{key}: expected a string value, got {show(value)}")
        env[key] = check_text(str(value), f"{field_name}.{key}", MAX_ENV_BYTES)
    if sum(len(k) + len(v) + 2 for k, v in env.items()) > MAX_ENV_BYTES:
        raise SpecError(field_name, f"the variables add up to more than {MAX_ENV_BYTES >> 10} KiB")
    return env


def _int(value: Any, field_name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field_name, f"expected a whole number, got {show(value)}")
    number = value
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise SpecError(field_name, f"must be {bound}, got {show(number)}")
    return number


# -- one checker per spec field ------------------------------------------------------------
# Each row: how the field is checked (value, name → normalised value) and its JSON Schema,
# which the launcher's OpenAPI document is built from. A new field is one row here.
@dataclass(frozen=True)
class FieldRule:
    check: Callable[[Any, str], Any]
    schema: dict[str, Any]
    nullable: bool = False

    def apply(self, value: Any, name: str) -> Any:
        if value is None and self.nullable:
            return None
        return self.check(value, name)

    def json_schema(self) -> dict[str, Any]:
        if not self.nullable:
            return self.schema
        return {"anyOf": [self.schema, {"type": "null"}]}


def _int_rule(low: int, high: int) -> FieldRule:
    return FieldRule(lambda v, n: _int(v, n, low, high),
                     {"type": "integer", "minimum": low, "maximum": high})


def _text_rule(limit: int = MAX_TEXT, nullable: bool = False, pattern: str | None = None) -> FieldRule:
    schema: dict[str, Any] = {"type": "string", "maxLength": limit}
    if pattern:
        schema["pattern"] = pattern
    return FieldRule(lambda v, n: check_text(v, n, limit), schema, nullable)


def _path_rule(nullable: bool = True) -> FieldRule:
    def check(value: Any, name: str) -> str:
        value = check_text(value, name, MAX_PATH, "a path")
        if not value:
            raise SpecError(name, "is empty; give a path")
        try:
            # Paths are written into scripts (an #SBATCH --chdir line, run.sh), where a
            # newline would end the line and run the rest as shell.
            shell.refuse_control(value, name, "give a path without newlines or other control characters")
        except shell.UnsafeValue as error:
            raise SpecError(name, error.reason) from None
        return value
    return FieldRule(check, {"type": "string", "minLength": 1, "maxLength": MAX_PATH,
                             "description": "an absolute path (the client resolves relative ones)"},
                     nullable)


def _choice_rule(options: tuple[str, ...], nullable: bool = False,
                 registry: Callable[[], tuple[str, ...]] | None = None) -> FieldRule:
    """One of `options`; with `registry`, of what it answers when checked (the engines: a
    package installed since this module was imported counts)."""
    def check(value: Any, name: str) -> str:
        known = registry() if registry else options
        if value not in known or not isinstance(value, str):
            raise SpecError(name, f"expected one of {', '.join(known)}, got {show(value)}")
        return value
    return FieldRule(check, {"type": "string", "enum": list(options)}, nullable)


# `--network`: a profile (tcp, rdma, debug), an interface (eth1), or both (tcp:eth1). A Linux
# interface name is at most 15 characters.
_IFACE = r"[A-Za-z0-9_.-]{1,15}"
_NETWORK = re.compile(rf"^(?:(?P<profile>{'|'.join(NETWORKS)})(?::(?P<iface>{_IFACE}))?|(?P<only>{_IFACE}))$")


def split_network(value: str | None) -> tuple[str | None, str | None]:
    """(profile, interface) of a `--network` value; either may be None."""
    match = _NETWORK.match(value or "")
    if not match:
        return None, None
    return match.group("profile"), match.group("iface") or match.group("only")


def _network_rule() -> FieldRule:
    def check(value: Any, name: str) -> str:
        if not isinstance(value, str) or not _NETWORK.match(value):
            raise SpecError(name, f"expected {', '.join(NETWORKS)}, an interface name (eth1) or "
                            f"both (tcp:eth1), got {show(value)}")
        return value
    # The schema's pattern without Python's named groups (JSON Schema regexes are ECMA-262).
    pattern = re.sub(r"\(\?P<\w+>", "(", _NETWORK.pattern)
    return FieldRule(check, {"type": "string", "pattern": pattern, "maxLength": 21,
                             "description": "an NCCL network profile, an interface, or PROFILE:IFACE"},
                     nullable=True)


def _duration_rule(nullable: bool = False) -> FieldRule:
    return FieldRule(parse_duration, {"anyOf": [
        {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION},
        {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)?\s*$", "maxLength": 39}]},
        nullable)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(name, f"expected true or false, got {show(value)}")
    return value


def _text_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list):
        raise SpecError(name, f"expected a list of strings, got {show(value)}")
    if len(value) > MAX_LIST:
        raise SpecError(name, f"{len(value)} items; at most {MAX_LIST} are allowed")
    return [check_text(item, f"{name}[{i}]") for i, item in enumerate(value)]


def _text_map(value: Any, name: str) -> dict[str, Any]:
    """A flat mapping of short strings to strings or null (files, source)."""
    if not isinstance(value, dict):
        raise SpecError(name, f"expected a mapping of names to strings, got {show(value)}")
    if len(value) > MAX_LIST:
        raise SpecError(name, f"{len(value)} entries; at most {MAX_LIST} are allowed")
    for key, item in value.items():
        check_text(key, name, 255, "a name", key=True)
        if item is not None:
            check_text(item, f"{name}.{key}", MAX_PATH)
    return value


def _scalar(value: Any, name: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if not is_finite(value):
            raise SpecError(name, f"expected a finite number, got {show(value)}")
        return value
    return check_text(value, name, MAX_PATH, "a string, number, true, false or null")


def _source_map(value: Any, name: str) -> dict[str, Any]:
    """Where a job came from: flat values, or lists of them (a cell's line map), for views."""
    if not isinstance(value, dict):
        raise SpecError(name, f"expected a mapping, got {show(value)}")
    if len(value) > 64:
        raise SpecError(name, f"{len(value)} entries; at most 64 are allowed")
    for key, item in value.items():
        check_text(key, name, 255, "a name", key=True)
        if isinstance(item, list):
            if len(item) > 100_000:
                raise SpecError(f"{name}.{key}", f"{len(item)} items; at most 100000 are allowed")
            for index, part in enumerate(item):
                if isinstance(part, list):  # a row of a line map: [script line, cell, line, ...]
                    if len(part) > 16:
                        raise SpecError(f"{name}.{key}[{index}]", f"{len(part)} items; at most 16")
                    for column, cell in enumerate(part):
                        _scalar(cell, f"{name}.{key}[{index}][{column}]")
                else:
                    _scalar(part, f"{name}.{key}[{index}]")
        else:
            _scalar(item, f"{name}.{key}")
    return value


FINITE_SCHEMA = {"type": "number", "minimum": -DOUBLE_MAX, "maximum": DOUBLE_MAX}
_SCALAR_SCHEMA = {"anyOf": [{"type": "string", "maxLength": MAX_PATH}, FINITE_SCHEMA,
                            {"type": "boolean"}, {"type": "null"}]}
_SOURCE_SCHEMA = {"type": "object", "maxProperties": 64, "additionalProperties": {"anyOf": [
    _SCALAR_SCHEMA, {"type": "array", "maxItems": 100_000, "items": {"anyOf": [
        _SCALAR_SCHEMA, {"type": "array", "maxItems": 16, "items": _SCALAR_SCHEMA}]}}]}}
_TEXT_LIST_SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": MAX_TEXT},
                     "maxItems": MAX_LIST}
_TEXT_MAP_SCHEMA = {"type": "object", "maxProperties": MAX_LIST,
                    "additionalProperties": {"type": ["string", "null"], "maxLength": MAX_PATH}}

def _resources(value: Any, name: str) -> dict[str, int]:
    """Per node: {"gpus", "cpus", "memory_mb"}; "memory" may be given as a size like 16G."""
    if not isinstance(value, dict):
        raise SpecError(name, "expected a mapping like {gpus: 8, cpus: 32, memory: 256G}")
    resources: dict[str, int] = {}
    for key, item in value.items():
        if item is None:
            continue
        if key == "gpus":
            resources["gpus"] = _int(item, f"{name}.gpus", 0, 64)
        elif key == "cpus":
            resources["cpus"] = _int(item, f"{name}.cpus", 1, 4096)
        elif key in ("memory", "memory_mb"):
            resources["memory_mb"] = parse_memory_mb(item, f"{name}.{key}")
        else:
            raise SpecError(f"{name}.{check_text(key, name, 40, 'a name', key=True)}",
                            "unknown resource; use gpus, cpus or memory")
    return resources


_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# `--from JOB[@STEP]`: a job id (or a unique prefix of one, or "last") and a committed step.
_BRANCH = re.compile(r"^(?P<job>[A-Za-z0-9][A-Za-z0-9._-]{0,62})(?:@(?P<step>\d{1,16}))?$")


def parse_branch(value: str) -> tuple[str, int | None]:
    """(job reference, step or None for the newest) of a `branch_from` value checked by its rule."""
    match = _BRANCH.fullmatch(value)
    assert match is not None, value
    step = match.group("step")
    return match.group("job"), (int(step) if step is not None else None)


def branch_parent(spec: dict[str, Any]) -> dict[str, Any] | None:
    """{"job", "step"} of a stored spec's parent (resolved to PARENT_ID@STEP at submit), or None."""
    value = spec.get("branch_from")
    if not isinstance(value, str) or "@" not in value or not _BRANCH.fullmatch(value):
        return None
    job, step = parse_branch(value)
    return {"job": job, "step": step}


def _branch_from(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > 80 or not _BRANCH.fullmatch(value):
        raise SpecError(name, f"expected JOB or JOB@STEP (a job id and a committed step, e.g. "
                        f"train-3f2a1c@2800), got {show(value)}; `jupyter-dlc checkpoints JOB` lists the steps")
    return value


# A sweep parameter's name (sweeps.py, runtime.params(), DLC_PARAM_<NAME>).
PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_PARAMS = 64


def _params(value: Any, name: str) -> dict[str, Any]:
    """A trial's parameters (`runtime.params()`): identifiers to finite numbers, booleans or
    short strings. Each also reaches the ranks as DLC_PARAM_<NAME>, so the names are words."""
    if not isinstance(value, dict):
        raise SpecError(name, f"expected a mapping of names to values, got {show(value)}")
    if len(value) > MAX_PARAMS:
        raise SpecError(name, f"{len(value)} parameters; at most {MAX_PARAMS} are allowed")
    for key, item in value.items():
        if not isinstance(key, str) or not PARAM_NAME.fullmatch(key):
            raise SpecError(name, f"{show(key)} is not a parameter name; use letters, digits and _ "
                            "(not first), e.g. lr or batch_size")
        if isinstance(item, str):
            check_text(item, f"{name}.{key}", 256)
            try:  # it reaches generated scripts (run.sh, job.sbatch) as DLC_PARAM_<NAME>
                shell.refuse_control(item, f"{name}.{key}", "give a value without newlines or other "
                                     "control characters")
            except shell.UnsafeValue as error:
                raise SpecError(f"{name}.{key}", error.reason) from None
        elif isinstance(item, bool) or (isinstance(item, (int, float)) and is_finite(item)):
            pass
        else:
            raise SpecError(f"{name}.{key}", f"expected a finite number, true, false or a string, got {show(item)}")
    upper = [key.upper() for key in value]
    if len(set(upper)) < len(upper):
        raise SpecError(name, "two names differ only in case, and would be one DLC_PARAM_<NAME>; rename one")
    return value


_SWEEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _sweep(value: Any, name: str) -> dict[str, Any]:
    """{"id", "trial", "parallel"}: the sweep a trial belongs to, its number, and how many of
    the sweep's trials may run at once (None: as admission allows)."""
    if not isinstance(value, dict) or set(value) - {"id", "trial", "parallel"} or "id" not in value:
        raise SpecError(name, f"expected {{id, trial, parallel}}, got {show(value)}")
    if not isinstance(value["id"], str) or not _SWEEP_ID.fullmatch(value["id"]):
        raise SpecError(f"{name}.id", "expected letters, digits, '.', '_' and '-' (at most 63), "
                        f"got {show(value['id'])}")
    out = {"id": value["id"], "trial": _int(value.get("trial", 0), f"{name}.trial", 0, 100_000),
           "parallel": None}
    if value.get("parallel") is not None:
        out["parallel"] = _int(value["parallel"], f"{name}.parallel", 1, 1024)
    return out


def params_env(params: dict[str, Any]) -> dict[str, str]:
    """What the ranks get of a trial's parameters: DLC_PARAMS (JSON, typed; `{}` for a job
    that is no trial, so that every rank has it) and one DLC_PARAM_<NAME> each (the value as
    text; true/false for booleans)."""
    import json

    env = {"DLC_PARAMS": json.dumps(params, sort_keys=True)}
    for key, value in params.items():
        env[f"DLC_PARAM_{key.upper()}"] = (("true" if value else "false") if isinstance(value, bool)
                                           else repr(value) if isinstance(value, float) else str(value))
    return env


def _cluster_name(value: Any, name: str) -> str:
    if not _PROFILE_NAME.fullmatch(check_text(value, name, 63)):
        raise SpecError(name, f"{show(value)} is not a profile name; see `jupyter-dlc clusters`")
    return value


_RESOURCES_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "gpus": {"type": ["integer", "null"], "minimum": 0, "maximum": 64},
    "cpus": {"type": ["integer", "null"], "minimum": 1, "maximum": 4096},
    "memory": {"type": ["string", "integer", "null"], "maxLength": 20,
               "description": "a size like 16G or 2000M (megabytes when a bare number)"},
    "memory_mb": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_MEMORY_MB}}}


SPEC_FIELDS: dict[str, FieldRule] = {
    "name": _text_rule(63, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})?$"),
    "script": _path_rule(),
    "code": _text_rule(MAX_CODE, nullable=True),
    "args": FieldRule(_text_list, _TEXT_LIST_SCHEMA),
    "nodes": _int_rule(1, 1024),
    "nproc_per_node": _int_rule(1, 64),
    "env": FieldRule(parse_env, {"anyOf": [
        {"type": "object", "maxProperties": MAX_ENV_VARS,
         "additionalProperties": {"type": "string", "maxLength": MAX_TEXT}},
        {"type": "array", "maxItems": MAX_ENV_VARS, "items": {"type": "string", "pattern": "="}}]}),
    "network": _network_rule(),
    "workdir": _path_rule(),
    "engine": _choice_rule(ENGINES, registry=engine_registry.names),
    "max_runtime": _duration_rule(nullable=True),
    "max_restarts": _int_rule(0, 100),
    "steps": dataclasses.replace(_int_rule(1, 2**53), nullable=True),
    "restart_backoff": _duration_rule(),
    "stop_grace": _duration_rule(),
    "heartbeat_interval": _duration_rule(),
    "heartbeat_misses": _int_rule(1, 100),
    "progress_timeout": _duration_rule(),
    "collective_timeout": _duration_rule(),
    "checkpoint_dir": _path_rule(),
    "keep_last": _int_rule(1, 1000),
    "alerts": FieldRule(_text_list, _TEXT_LIST_SCHEMA),
    "default_alerts": FieldRule(_bool, {"type": "boolean"}),
    "files": FieldRule(_text_map, _TEXT_MAP_SCHEMA),
    "source": FieldRule(_source_map, _SOURCE_SCHEMA),
    "python": _path_rule(),
    "cluster": FieldRule(_cluster_name, {"type": "string", "pattern": _PROFILE_NAME.pattern},
                         nullable=True),
    "resources": FieldRule(_resources, _RESOURCES_SCHEMA),
    "branch_from": FieldRule(_branch_from, {"type": "string", "maxLength": 80,
                                            "pattern": re.sub(r"\(\?P<\w+>", "(", _BRANCH.pattern),
                                            "description": "JOB or JOB@STEP: start from that job's "
                                            "committed step (the newest if no step), running this code"},
                             nullable=True),
    "fresh_optimizer": FieldRule(_bool, {"type": "boolean"}),
    "params": FieldRule(_params, {"type": "object", "maxProperties": MAX_PARAMS,
                                  "propertyNames": {"pattern": PARAM_NAME.pattern},
                                  "additionalProperties": {"anyOf": [
                                      {"type": "string", "maxLength": 256}, FINITE_SCHEMA,
                                      {"type": "boolean"}]},
                                  "description": "a trial's parameters: runtime.params(), DLC_PARAM_<NAME>"}),
    "sweep": FieldRule(_sweep, {"type": "object", "additionalProperties": False, "required": ["id"],
                                "properties": {"id": {"type": "string", "pattern": _SWEEP_ID.pattern},
                                               "trial": {"type": "integer", "minimum": 0, "maximum": 100_000},
                                               "parallel": {"type": ["integer", "null"], "minimum": 1,
                                                            "maximum": 1024}},
                                "description": "the sweep a trial belongs to; at most `parallel` of "
                                               "its trials run at once"},
                       nullable=True),
}

# The paths a spec may hold; the client makes them absolute against the user's directory.
PATH_FIELDS = ("script", "workdir", "checkpoint_dir", "python")


def resolve_paths(data: dict[str, Any], base: str | None = None) -> dict[str, Any]:
    """`data` with relative (and ~) PATH_FIELDS made absolute against `base` (default: cwd),
    the directory the user meant; the launcher and the ranks run elsewhere."""
    base = base or os.getcwd()
    out = dict(data)
    for name in PATH_FIELDS:
        value = out.get(name)
        if isinstance(value, str) and value and "\0" not in value:
            out[name] = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    return out


def require_absolute_paths(spec: JobSpec) -> None:
    """The launcher's rule: it never guesses whose working directory a relative path meant."""
    for name in PATH_FIELDS:
        value = getattr(spec, name)
        if value is not None and not os.path.isabs(value):
            raise SpecError(name, f"{show(value)} is relative; give an absolute path "
                                  "(jupyter-dlc and %%dlc resolve it against your directory)")


# "backend" was the spec's (and the CLI's) word for the engine until 0.x: still taken where
# users may have typed it or an older launcher stored it, with a deprecation note.
OLD_ENGINE_FIELD = "backend"


def engine_field(data: Any) -> Any:
    """`data` (a spec as a dict) with the old field name `backend` read as `engine`."""
    if not isinstance(data, dict) or OLD_ENGINE_FIELD not in data:
        return data
    data = dict(data)
    old = data.pop(OLD_ENGINE_FIELD)
    if "engine" in data and data["engine"] != old:
        raise SpecError("engine", f"{show(data['engine'])} conflicts with backend {show(old)} "
                        "(the old name of the same field); give only engine")
    data["engine"] = old
    warnings.warn("the spec field 'backend' is now 'engine'; 'backend' is still taken",
                  DeprecationWarning, stacklevel=3)
    return data


def spec_engine(spec: dict[str, Any]) -> str:
    """The engine of a spec stored as a dict, by either name (an older launcher's record)."""
    return spec.get("engine") or spec.get(OLD_ENGINE_FIELD) or engine_registry.DEFAULT


class _OldSpelling(argparse.Action):
    """Takes an option by its new name or its old one, with a note for the old one."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == "--backend":
            print("jupyter-dlc: --backend is now --engine (still taken)", file=sys.stderr)
        setattr(namespace, self.dest, values)


@dataclass
class JobSpec:
    """A job as the user asked for it. Durations are seconds."""

    name: str = ""
    # Exactly one of `script` (a file to run) or `code` (a cell body) is given.
    script: str | None = None
    code: str | None = None
    args: list[str] = field(default_factory=list)
    nodes: int = 1
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    network: str | None = None
    workdir: str | None = None
    engine: str = engine_registry.DEFAULT
    max_runtime: float | None = None
    max_restarts: int = 3
    # The steps the job will run (progress and ETA); the script may say it instead:
    # runtime.init(total_steps=N).
    steps: int | None = None
    restart_backoff: float = 1.0
    stop_grace: float = 30.0
    heartbeat_interval: float = 5.0
    heartbeat_misses: int = 3
    progress_timeout: float = 900.0
    collective_timeout: float = 1800.0
    checkpoint_dir: str | None = None
    keep_last: int = 3
    alerts: list[str] = field(default_factory=list)
    default_alerts: bool = True
    # Files staged by the client (pushed values) to copy into the job directory: name → path.
    files: dict[str, str] = field(default_factory=dict)
    # Where the job came from, so views can open it: {"kind": "notebook"|"cli", "path": ...}.
    source: dict[str, Any] = field(default_factory=dict)
    python: str | None = None
    # A cluster profile (dlc_clusters.yaml) naming the engine and its options; None: local.
    cluster: str | None = None
    # Per node: {"gpus": int, "cpus": int, "memory_mb": int}; each engine checks it at submit.
    resources: dict[str, int] = field(default_factory=dict)
    # A branch (`--from JOB@STEP`): the first attempt restores that job's step, running this
    # spec's code; the launcher stores it as PARENT_ID@STEP once resolved (launcher/branches.py).
    branch_from: str | None = None
    # With branch_from: restore the model (and the rest) but not the optimizer's state.
    fresh_optimizer: bool = False
    # A sweep's trial: its parameters (runtime.params()) and {"id", "trial", "parallel"}.
    params: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        if not isinstance(data, dict):
            raise SpecError("spec", "expected a JSON object")
        data = engine_field(data)
        unknown = sorted(str(key) for key in set(data) - set(SPEC_FIELDS))
        if unknown:
            raise SpecError(unknown[0], f"unknown field; known fields are {', '.join(SPEC_FIELDS)}")
        spec = cls(**data)
        spec.validate()
        return spec

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> JobSpec:
        """Every field's type and range (SPEC_FIELDS), then the rules between fields."""
        for name, rule in SPEC_FIELDS.items():
            setattr(self, name, rule.apply(getattr(self, name), name))
        if (self.script is None) == (self.code is None):
            raise SpecError("script", "give either a script path or the code to run, not both or neither")
        if self.code is not None and not self.code.strip():
            raise SpecError("code", "the cell is empty; write the training code in the cell")
        self._check_timeout_order()
        if self.fresh_optimizer and self.branch_from is None:
            raise SpecError("fresh_optimizer", "only applies to a branch; give --from JOB@STEP too, "
                            "or drop --fresh-optimizer")
        for name, path in self.files.items():
            if "/" in name or name.startswith(".") or not isinstance(path, str) or not os.path.isfile(path):
                raise SpecError("files", f"{show(name)} → {show(path)} is not a plain name and a readable file")
        if not self.name:
            self.name = os.path.splitext(os.path.basename(self.script))[0] if self.script else "cell"
            if not _JOB_NAME.fullmatch(self.name):
                self.name = "script"  # a file name that is no job name: the user did not pick it
        if not _JOB_NAME.fullmatch(self.name):
            raise SpecError("name", f"{show(self.name)}: use letters, digits, '.', '_' and '-' (at most 63)")
        return self

    def _check_timeout_order(self) -> None:
        # A missed-heartbeat verdict must come before the stall alert, which must come before
        # the collective timeout; otherwise a hang is reported as the wrong failure, or never.
        heartbeat = self.heartbeat_interval * self.heartbeat_misses
        if not heartbeat < self.progress_timeout:
            raise SpecError(
                "progress_timeout",
                f"{format_duration(self.progress_timeout)} must be longer than the heartbeat verdict "
                f"(heartbeat_interval x heartbeat_misses = {format_duration(heartbeat)}), "
                "or a stall is reported before a dead rank is noticed",
            )
        if not self.progress_timeout < self.collective_timeout:
            raise SpecError(
                "collective_timeout",
                f"{format_duration(self.collective_timeout)} must be longer than progress_timeout "
                f"({format_duration(self.progress_timeout)}), or a hung collective kills the job "
                "before the stall is diagnosed",
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


def network_env(network: str | None, interface: str | None = None) -> dict[str, str]:
    """NCCL variables for a `--network` value (a profile, an interface or both; `interface`
    is the cluster profile's, which the value's own overrides); the trace buffer and dump
    are always on. An interface also pins gloo (GLOO_SOCKET_IFNAME): across hosts it would
    otherwise bind the address of the host name, often 127.0.x.1."""
    profile, own = split_network(network)
    interface = own or interface
    # TORCH_FR_BUFFER_SIZE is the flight recorder's name for TORCH_NCCL_TRACE_BUFFER_SIZE since
    # torch 2.7 (the old name still works there, with a warning in every rank's log).
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if profile == "tcp":
        env.update({"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": interface or "lo"})
    elif profile == "rdma":
        env.update({"NCCL_IB_HCA": os.environ.get("NCCL_IB_HCA", "mlx5"), "NCCL_IB_GID_INDEX": "3",
                    "NCCL_SOCKET_IFNAME": interface or os.environ.get("NCCL_SOCKET_IFNAME", "eth0")})
    elif profile == "debug":
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    if interface:
        env.update({"NCCL_SOCKET_IFNAME": interface, "GLOO_SOCKET_IFNAME": interface})
    return env


# The job options of `%%dlc` and `jupyter-dlc run`, declared once: (flags, argparse keywords).
JOB_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--nodes", "-n"), dict(type=int, default=1, help="simulated nodes (torchrun agents)")),
    (("--nproc-per-node", "-p"), dict(type=int, default=1, help="processes per node")),
    (("--name",), dict(default=None, help="job name (letters, digits, . _ -)")),
    (("--env", "-e"), dict(action="append", default=[], metavar="K=V",
                           help="environment variable for every rank (repeatable)")),
    (("--network",), dict(default=None, metavar="PROFILE|IFACE|PROFILE:IFACE",
                          help="NCCL network profile (tcp, rdma, debug) and/or the interface "
                               "for NCCL and gloo, e.g. tcp:eth1")),
    (("--max-runtime",), dict(default=None, help="stop the job after this long, e.g. 2h")),
    (("--workdir",), dict(default=None, help="working directory of the ranks")),
    (("--max-restarts",), dict(type=int, default=3, help="automatic restarts on failure")),
    (("--steps",), dict(type=int, default=None, metavar="N",
                        help="steps the job will run, for progress and ETA")),
    (("--checkpoint-dir",), dict(default=None, help="where checkpoints go (default: job dir)")),
    (("--keep-last",), dict(type=int, default=3, help="committed checkpoints to keep")),
    (("--heartbeat-interval",), dict(default="5s", help="runtime heartbeat interval")),
    (("--progress-timeout",), dict(default="15m", help="no step progress for this long is a hang")),
    (("--alert",), dict(action="append", default=[], metavar="RULE",
                        help="alert rule, e.g. 'gpu_util < 0.3 for 15m -> stop' (repeatable)")),
    (("--no-default-alerts",), dict(action="store_true", help="turn the default alert rules off")),
    (("--dry-run",), dict(action="store_true",
                          help="print what the engine would be asked (torchrun per node, the "
                               "sbatch script, the manifests) and submit nothing")),
    (("--engine", "--backend"), dict(default=engine_registry.DEFAULT, choices=list(ENGINES), action=_OldSpelling,
                                     help="engine to run on (--backend: the old spelling, still taken)")),
    (("--cluster",), dict(default=None, help="cluster profile to run on (see jupyter-dlc clusters)")),
    (("--from",), dict(dest="branch_from", default=None, metavar="JOB[@STEP]",
                       help="branch: start from that job's committed step (default its newest), "
                            "running this code")),
    (("--fresh-optimizer",), dict(action="store_true",
                                  help="with --from: restore the model but not the optimizer's state")),
    (("--sweep",), dict(action="append", default=[], metavar="NAME=VALUES",
                        help="a sweep axis, each trial a job: lr=1e-3,3e-4 (grid) or "
                             "'lr=loguniform(1e-4,1e-2)' with --trials (repeatable)")),
    (("--trials",), dict(type=int, default=None, metavar="N",
                         help="sweep: trials drawn at random (each grid point N times)")),
    (("--parallel",), dict(type=int, default=None, metavar="K",
                           help="sweep: at most K trials run at once")),
    (("--sweep-seed",), dict(type=int, default=0, metavar="S", help="sweep: the random draws' seed")),
    (("--gpus-per-node",), dict(type=int, default=None, help="GPUs each node needs")),
    (("--cpus-per-node",), dict(type=int, default=None, help="CPU cores each node needs")),
    (("--memory-per-node",), dict(default=None, help="memory each node needs, e.g. 64G")),
]


def spec_from_options(options: Any, **fields: Any) -> JobSpec:
    """A validated JobSpec from parsed JOB_OPTIONS plus `fields` (script or code, source...).

    Relative paths are resolved here, against the directory the user is in now: the launcher
    and the ranks run in other directories and would each read them differently.
    """
    return JobSpec.from_dict(resolve_paths(dict(
        name=options.name or "", nodes=options.nodes, nproc_per_node=options.nproc_per_node,
        env=parse_env(options.env), network=options.network, max_runtime=options.max_runtime,
        workdir=options.workdir or os.getcwd(),
        max_restarts=options.max_restarts, steps=options.steps, checkpoint_dir=options.checkpoint_dir,
        keep_last=options.keep_last, heartbeat_interval=options.heartbeat_interval,
        progress_timeout=options.progress_timeout, alerts=list(options.alert),
        default_alerts=not options.no_default_alerts, engine=options.engine,
        cluster=options.cluster, branch_from=options.branch_from,
        fresh_optimizer=options.fresh_optimizer,
        resources={"gpus": options.gpus_per_node, "cpus": options.cpus_per_node,
                   "memory": options.memory_per_node}, **fields)))
