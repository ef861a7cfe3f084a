"""JobSpec: what a job is, validated once, with one-line errors that name the field.

The magics, the CLI and the launcher all build jobs through `JobSpec.from_dict`, so a bad
value gets the same message wherever it came from.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("local", "slurm", "kubernetes")
NETWORKS = ("tcp", "rdma", "debug")

# torchrun and the launcher own these; a user's --env must not break the rendezvous.
RENDEZVOUS_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
     "MASTER_PORT", "DLC_JOB_ID", "DLC_ATTEMPT", "DLC_TOKEN", "DLC_LAUNCHER_URL"}
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class SpecError(ValueError):
    """A one-line, user-facing error: `field: what is wrong; how to fix it`."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def parse_duration(value: Any, field_name: str) -> float:
    """Seconds from 90, "90", "90s", "15m", "2h", "1d" or "250ms"."""
    if isinstance(value, bool):
        raise SpecError(field_name, f"expected a duration like 90s, 15m or 2h, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise SpecError(field_name, f"expected a duration like 90s, 15m or 2h, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise SpecError(field_name, f"must be positive, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_env(items: list[str] | dict[str, Any] | None, field_name: str = "env") -> dict[str, str]:
    """`["K=V", ...]` or a dict → dict; names checked, rendezvous variables refused."""
    if not items:
        return {}
    pairs: list[tuple[str, Any]]
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            if "=" not in str(item):
                raise SpecError(field_name, f"expected K=V, got {item!r}; write e.g. --env LR=0.1")
            key, _, value = str(item).partition("=")
            pairs.append((key.strip(), value))
    env = {}
    for key, value in pairs:
        if not _ENV_NAME.match(key):
            raise SpecError(field_name, f"{key!r} is not a valid variable name")
        if key in RENDEZVOUS_VARS:
            raise SpecError(field_name, f"{key} is set by torchrun and the launcher; it cannot be overridden")
        env[key] = str(value)
    return env


def _int(value: Any, field_name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SpecError(field_name, f"expected a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise SpecError(field_name, f"expected a whole number, got {value!r}") from None
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise SpecError(field_name, f"must be {bound}, got {number}")
    return number


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
    backend: str = "local"
    max_runtime: float | None = None
    max_restarts: int = 3
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        if not isinstance(data, dict):
            raise SpecError("spec", "expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], f"unknown field; known fields are {', '.join(sorted(known))}")
        spec = cls(**data)
        spec.validate()
        return spec

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> JobSpec:
        if (self.script is None) == (self.code is None):
            raise SpecError("script", "give either a script path or the code to run, not both or neither")
        if self.code is not None and not str(self.code).strip():
            raise SpecError("code", "the cell is empty; write the training code in the cell")
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise SpecError("args", "expected a list of strings")
        self.nodes = _int(self.nodes, "nodes", 1, 1024)
        self.nproc_per_node = _int(self.nproc_per_node, "nproc_per_node", 1, 64)
        self.env = parse_env(self.env)
        if self.network is not None and self.network not in NETWORKS:
            raise SpecError("network", f"expected one of {', '.join(NETWORKS)}, got {self.network!r}")
        if self.backend not in BACKENDS:
            raise SpecError("backend", f"expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.max_runtime is not None:
            self.max_runtime = parse_duration(self.max_runtime, "max_runtime")
        self.max_restarts = _int(self.max_restarts, "max_restarts", 0, 100)
        self.keep_last = _int(self.keep_last, "keep_last", 1, 1000)
        self.heartbeat_misses = _int(self.heartbeat_misses, "heartbeat_misses", 1, 100)
        for name in ("restart_backoff", "stop_grace", "heartbeat_interval", "progress_timeout",
                     "collective_timeout"):
            setattr(self, name, parse_duration(getattr(self, name), name))
        self._check_timeout_order()
        if not isinstance(self.alerts, list) or not all(isinstance(a, str) for a in self.alerts):
            raise SpecError("alerts", "expected a list of rule strings like 'loss is nan -> stop'")
        if not isinstance(self.files, dict):
            raise SpecError("files", "expected a mapping of name to staged path")
        for name, path in self.files.items():
            if "/" in name or name.startswith(".") or not os.path.isfile(path):
                raise SpecError("files", f"{name!r} → {path!r} is not a plain name and a readable file")
        if not self.name:
            self.name = os.path.splitext(os.path.basename(self.script))[0] if self.script else "cell"
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", self.name):
            raise SpecError("name", f"{self.name!r}: use letters, digits, '.', '_' and '-' (at most 63)")
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


def network_env(profile: str | None, interface: str | None = None) -> dict[str, str]:
    """NCCL variables for a network profile; the trace buffer and dump are always on."""
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
    return env


# The job options of `%%dlc` and `jupyter-dlc run`, declared once: (flags, argparse keywords).
JOB_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--nodes", "-n"), dict(type=int, default=1, help="simulated nodes (torchrun agents)")),
    (("--nproc-per-node", "-p"), dict(type=int, default=1, help="processes per node")),
    (("--name",), dict(default=None, help="job name (letters, digits, . _ -)")),
    (("--env", "-e"), dict(action="append", default=[], metavar="K=V",
                           help="environment variable for every rank (repeatable)")),
    (("--network",), dict(default=None, choices=list(NETWORKS), help="NCCL network profile")),
    (("--max-runtime",), dict(default=None, help="stop the job after this long, e.g. 2h")),
    (("--workdir",), dict(default=None, help="working directory of the ranks")),
    (("--max-restarts",), dict(type=int, default=3, help="automatic restarts on failure")),
    (("--checkpoint-dir",), dict(default=None, help="where checkpoints go (default: job dir)")),
    (("--keep-last",), dict(type=int, default=3, help="committed checkpoints to keep")),
    (("--heartbeat-interval",), dict(default="5s", help="runtime heartbeat interval")),
    (("--progress-timeout",), dict(default="15m", help="no step progress for this long is a hang")),
    (("--alert",), dict(action="append", default=[], metavar="RULE",
                        help="alert rule, e.g. 'gpu_util < 0.3 for 15m -> stop' (repeatable)")),
    (("--no-default-alerts",), dict(action="store_true", help="turn the default alert rules off")),
    (("--backend",), dict(default="local", choices=list(BACKENDS), help="engine to run on")),
]


def spec_from_options(options: Any, **fields: Any) -> JobSpec:
    """A validated JobSpec from parsed JOB_OPTIONS plus `fields` (script or code, source...)."""
    return JobSpec.from_dict(dict(
        name=options.name or "", nodes=options.nodes, nproc_per_node=options.nproc_per_node,
        env=parse_env(options.env), network=options.network, max_runtime=options.max_runtime,
        workdir=os.path.abspath(options.workdir) if options.workdir else os.getcwd(),
        max_restarts=options.max_restarts, checkpoint_dir=options.checkpoint_dir,
        keep_last=options.keep_last, heartbeat_interval=options.heartbeat_interval,
        progress_timeout=options.progress_timeout, alerts=list(options.alert),
        default_alerts=not options.no_default_alerts, backend=options.backend, **fields))
