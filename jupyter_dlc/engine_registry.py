"""The engine registry: which engines exist, and the options a cluster profile may give each.

Engines register through the entry-point group `jupyter_dlc.engines` (name = "module:Class",
after TorchX's `torchx.schedulers`), this package's own four included (pyproject.toml). A
package of its own adds an engine with one entry point and no edit here: the spec's
`engine` choices, the CLI's `--engine`, `dlc_clusters.yaml` validation and the OpenAPI
document all read this registry. An engine class declares its `name`, its
`profile_options` (`Option`s: the type, what to write, fixed choices) and its capabilities
(`contract.Capabilities`); `contract.get_engine` makes the one instance.

Imports nothing of ours (spec, clusters and the OpenAPI document read it); the classes are
imported only when asked for (`engine_class`), through their entry points.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any

GROUP = "jupyter_dlc.engines"
OWN = "jupyter-dlc"  # this package's distribution: its engines come first, and win a clash
DEFAULT = "local"  # the engine of a job that names none (no cluster profile either)

log = logging.getLogger("jupyter_dlc.engines")


class UnknownEngine(ValueError):
    """A name no installed engine registers (one line: what exists, how to add one)."""


@dataclass(frozen=True)
class Option:
    """One cluster-profile option of an engine: its type (str, bool, int, list, dict), what
    to write (the error's second half), fixed values where there are some, and the type of
    a list's items. One value shape for all engines: clusters.py checks every option with it."""

    kind: type
    expected: str
    choices: tuple[str, ...] = ()
    items: type = str
    number_as_text: bool = False  # a bare number is taken as its text (Slurm's minutes)

    def schema(self) -> dict[str, Any]:
        """The option as JSON Schema (the OpenAPI document's ClusterProfile)."""
        types = {str: "string", bool: "boolean", int: "integer", list: "array", dict: "object"}
        out: dict[str, Any] = {"type": [types[self.kind], "integer"] if self.number_as_text
                               else types[self.kind], "description": self.expected}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.kind is list:
            out["items"] = {"type": types[self.items]}
        return out


@functools.cache
def _entries() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    # Ours first, `local` (the default) first of all, then by name: a stable order for lists
    # and messages, whatever order the metadata keeps.
    points = sorted(importlib.metadata.entry_points(group=GROUP),
                    key=lambda ep: (_dist(ep) != OWN, ep.name != DEFAULT, _dist(ep) or "", ep.name))
    for point in points:
        if point.name in found:
            log.warning("engine %r of %s is ignored: %s registers that name first", point.name,
                        _dist(point), _dist(found[point.name]))
            continue
        found[point.name] = point
    return found


def _dist(point: importlib.metadata.EntryPoint) -> str | None:
    return point.dist.name if point.dist is not None else None


def names() -> tuple[str, ...]:
    """Every registered engine: `local`, this package's others, then other packages'."""
    found = tuple(_entries())
    if not found:
        raise UnknownEngine("engines: none is registered; the package's metadata is missing "
                            "(reinstall it: pip install jupyter-dlc)")
    return found


def refresh() -> None:
    """Read the entry points again (after a package was installed in this process)."""
    _entries.cache_clear()
    engine_class.cache_clear()


@functools.cache
def engine_class(name: str) -> type:
    """The engine's class, imported through its entry point."""
    point = _entries().get(name)
    if point is None:
        raise UnknownEngine(f"engine: {name!r} is not an engine here; engines: {', '.join(names())} "
                            f"(another installs with an entry point in the {GROUP!r} group)")
    cls = point.load()
    if getattr(cls, "name", None) != name:
        raise UnknownEngine(f"engine: the entry point {name!r} ({point.value}) loads an engine "
                            f"named {getattr(cls, 'name', None)!r}; its class must say name = {name!r}")
    return cls


def profile_options(name: str) -> dict[str, Option]:
    """The options a cluster profile of this engine may give (besides the common ones)."""
    return dict(getattr(engine_class(name), "profile_options", {}))
