"""Engines behind one small interface (after TorchX's scheduler contract).

`dry_run` returns the engine's native request (torchrun argv per node, an sbatch script, a
PyTorchJob manifest) without starting anything: it is both what `export` writes and the
test seam. `start` launches and returns a JSON-able handle the launcher stores, so that a
restarted launcher can `poll` and `stop` processes it did not start itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec import JobSpec


@dataclass
class AttemptContext:
    """Everything an engine needs to start one attempt of a job."""

    job_id: str
    attempt: int
    spec: JobSpec
    job_dir: str
    attempt_dir: str
    script_path: str
    env: dict[str, str]
    port: int


@dataclass
class NodeStatus:
    node: int
    running: bool
    exit_code: int | None = None


@dataclass
class RankStatus:
    rank: int
    pid: int | None = None
    running: bool = False
    exit_code: int | None = None
    start: float | None = None
    end: float | None = None


@dataclass
class AttemptStatus:
    nodes: list[NodeStatus] = field(default_factory=list)
    ranks: dict[int, RankStatus] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)


class Backend:
    name = "base"

    def dry_run(self, ctx: AttemptContext) -> dict[str, Any]:
        raise NotImplementedError

    def capacity_error(self, spec: JobSpec) -> str | None:
        """A reason this engine cannot run `spec` at all, checked at submit time."""
        return None

    def start(self, ctx: AttemptContext) -> dict[str, Any]:
        raise NotImplementedError

    def poll(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        raise NotImplementedError

    def signal(self, ctx: AttemptContext, handle: dict[str, Any], sig: int) -> int:
        """Send `sig` to every process of the attempt; returns how many were signalled."""
        raise NotImplementedError


def get_backend(name: str) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend()
    raise ValueError(f"backend: {name!r} is not available here; use backend='local'")
