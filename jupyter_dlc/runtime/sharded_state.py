"""FSDP2 (`fully_shard`) state in the Checkpointer: each rank saves and restores its own shard.

Under FSDP2 a module's parameters, and so its state_dict and its optimizer's state, are
DTensors. A rank file holds only plain tensors: `localize` keeps each DTensor's local shard.
`globalize_*` wraps the saved shards back into DTensors shaped like the live objects' (same
mesh and placements), which a restore into the same world requires; the Checkpointer already
refuses a different world size.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no FSDP2 either
        return None
    return DTensor


def localize(value: Any) -> Any:
    """`value` with every DTensor replaced by its local shard; containers holding none are
    returned as they are (no copy, whatever their type)."""
    dtensor = _dtensor_type()
    return value if dtensor is None else _localize(value, dtensor)


def _localize(value: Any, dtensor: Any) -> Any:
    if isinstance(value, dtensor):
        return value.to_local()
    if type(value) in (dict, OrderedDict):
        entries = {k: _localize(v, dtensor) for k, v in value.items()}
        if all(entries[k] is v for k, v in value.items()):
            return value
        out: Any = type(value)(entries)
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata  # module state_dict versions, read on load
        return out
    if type(value) in (list, tuple):
        items = [_localize(v, dtensor) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
    return value


def _like(saved: Any, template: Any) -> Any:
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(template, dtensor) or isinstance(saved, dtensor) \
            or not isinstance(saved, torch.Tensor) or saved.shape != template.to_local().shape:
        return saved
    return dtensor.from_local(saved.to(template.to_local().device), template.device_mesh,
                              template.placements, run_check=False, shape=template.shape,
                              stride=template.stride())


def globalize_module_state(saved: dict, live: dict) -> dict:
    """A saved module state_dict with its shards re-wrapped like the live state_dict's."""
    out: Any = type(saved)((key, _like(value, live.get(key))) for key, value in saved.items())
    if hasattr(saved, "_metadata"):
        out._metadata = saved._metadata
    return out


def globalize_optimizer_state(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A saved optimizer state_dict whose per-parameter tensors (exp_avg, ...) are shards of
    DTensor parameters, re-wrapped like those parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ids = [i for group in saved.get("param_groups", []) for i in group["params"]]
    by_id = dict(zip(ids, params, strict=False))
    state = {key: ({name: _like(value, by_id.get(key)) for name, value in entry.items()}
                   if isinstance(entry, dict) else entry)
             for key, entry in saved.get("state", {}).items()}
    return {**saved, "state": state}


def globalize(saved: Any, obj: Any) -> Any:
    """`saved` (this object's localized state) ready for obj.load_state_dict."""
    if _dtensor_type() is None or not isinstance(saved, dict):
        return saved
    if isinstance(obj, torch.optim.Optimizer):
        return globalize_optimizer_state(saved, obj)
    if isinstance(obj, torch.nn.Module):
        return globalize_module_state(saved, obj.state_dict())
    return saved


def holds_shards(state: Any) -> bool:
    """Whether a state_dict (nested) holds a DTensor: this rank's part only, not a replica."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return False
    if isinstance(state, dtensor):
        return True
    if isinstance(state, dict):
        return any(holds_shards(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_shards(v) for v in state)
    return False
