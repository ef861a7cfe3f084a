"""Exact resume under DistributedDataParallel: carry DDP's gradient bucket layout.

DDP all-reduces gradients in buckets. It builds them first from the parameter order, and
after its first iteration rebuilds them in the order gradients became ready; the layout
decides which floating-point sums the all-reduce does in which order. A resumed attempt
starts with a new DDP, whose first step would run on the initial layout, so its parameters
would drift from an uninterrupted run's in the last bits. The Checkpointer saves the rebuilt
layout with every checkpoint and installs it on restore, before the first forward, so the
resumed job continues bit for bit. The user's script does not change.

Where it cannot (a communication hook registered before restore(), the Python reducer),
restore says so in one line. With find_unused_parameters=True (and no static_graph) DDP
never rebuilds its buckets, so there is nothing to carry and resume is exact as it is.
The private DDP internals are in shims/torch_private.py.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from ..shims import torch_private

STATE_KEY = "ddp_bucket_layout"


def find_ddp(obj: Any) -> Any:
    """The DDP wrapper of `obj`: itself, or the DDP whose `.module` it is (a script may hand
    the Checkpointer `ddp.module` for state-dict keys without the "module." prefix)."""
    if torch_private.is_ddp(obj):
        return obj
    import torch

    if not isinstance(obj, torch.nn.Module):
        return None
    return next((o for o in gc.get_objects() if torch_private.is_ddp(o) and o.module is obj), None)


def capture(ddps: dict[str, Any]) -> dict[str, list[list[int]]]:
    """{object name: layout} of every DDP that has rebuilt its buckets (see the shim)."""
    out = {}
    for name, ddp in ddps.items():
        if torch_private.layout_blocker(ddp) is None:
            layout = torch_private.bucket_layout(ddp)
            if layout is not None:
                out[name] = layout
    return out


def restore(ddps: dict[str, Any], saved: dict[str, list[list[int]]], rank: int) -> list[str]:
    """Install the saved layouts; one line per DDP that cannot have it (printed on rank 0)."""
    notes = []
    for name, layout in (saved or {}).items():
        ddp = ddps.get(name)
        if ddp is None:
            notes.append(f"{name!r} was saved from a DDP model but is not one now; its first "
                         "resumed step may differ in the last bits from an uninterrupted run")
            continue
        blocker = torch_private.layout_blocker(ddp)
        if blocker is None:
            try:
                torch_private.install_bucket_layout(ddp, layout)
                continue
            except ValueError as error:
                blocker = str(error)
        notes.append(f"DDP's gradient bucket layout of {name!r} cannot be restored ({blocker}); "
                     "the resumed run may differ in the last bits from an uninterrupted one")
    if rank == 0:
        for note in notes:
            print(f"jupyter_dlc: {note}", file=sys.stderr, flush=True)
    return notes
