"""Load a checkpoint's state into the script's objects, telling the truth when they changed.

A restore meets changed code in a branch (`--from JOB@STEP` with an edited cell) and in a
resume after the script was edited. `load_state_dict` then raises a traceback that buries
the keys; here every module is compared with the checkpoint first, and a mismatch is one
`CheckpointMismatch` whose first line names the keys (the launcher's `why` shows that line)
and whose next lines list them all, with the two ways on:
- `restore(strict=False)`: the keys that match (by name and shape) are restored, the rest
  stay as the code initialised them (a new head, a widened layer);
- `--fresh-optimizer` (DLC_FRESH_OPTIMIZER=1): the optimizer is not restored, since its
  state is per parameter and a changed model no longer lines up with it.

A branch keeps the code's hyperparameters: a researcher who lowers the learning rate in the
cell and branches means the new rate, while `Optimizer.load_state_dict` would put the saved
one back. So on the restore of the branch step each optimizer param group keeps the code's
values for everything but its parameters' state, and an LR scheduler keeps the code's
`base_lrs`. A plain restart or resume restores everything as saved.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from . import sharded_state

SHOWN_KEYS = 24  # per list on the one screen; the rest are counted


class CheckpointMismatch(RuntimeError):
    """The code's model or optimizer does not fit the checkpoint being restored."""


@dataclass
class ModuleDiff:
    missing: list[str] = field(default_factory=list)      # in the code's module, not in the checkpoint
    unexpected: list[str] = field(default_factory=list)   # in the checkpoint, not in the module
    reshaped: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # key, saved, live

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.reshaped)

    def summary(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing from the checkpoint {_names(self.missing, 4)}")
        if self.unexpected:
            parts.append(f"not in your model {_names(self.unexpected, 4)}")
        if self.reshaped:
            parts.append("reshaped " + _names([f"{k} {_shape(s)}->{_shape(v)}" for k, s, v in self.reshaped], 3))
        return "; ".join(parts)

    def lines(self) -> list[str]:
        out = []
        for title, keys in (("missing from the checkpoint (new in your model)", self.missing),
                            ("not in your model (only in the checkpoint)", self.unexpected),
                            ("reshaped (checkpoint -> your model)",
                             [f"{k}: {_shape(s)} -> {_shape(v)}" for k, s, v in self.reshaped])):
            if keys:
                out.append(f"  {title}, {len(keys)}:")
                out.extend(f"    {key}" for key in keys[:SHOWN_KEYS])
                if len(keys) > SHOWN_KEYS:
                    out.append(f"    ... and {len(keys) - SHOWN_KEYS} more")
        return out


def module_diff(saved: dict, live: dict) -> ModuleDiff:
    """How a module's saved state_dict differs from the live module's."""
    diff = ModuleDiff()
    for key, value in live.items():
        if key not in saved:
            diff.missing.append(key)
        elif _is_tensor(value) and _is_tensor(saved[key]) and tuple(saved[key].shape) != tuple(value.shape):
            diff.reshaped.append((key, tuple(saved[key].shape), tuple(value.shape)))
    diff.unexpected = [key for key in saved if key not in live]
    return diff


def load(objects: dict[str, Any], state: dict, where: str, *, strict: bool, branch: str,
         fresh_optimizer: bool) -> list[str]:
    """Every object of `objects` loaded from `state` (one rank's file of step `where`);
    returns the names of the modules that differed (restored with strict=False).
    `branch`: PARENT@STEP when this is the restore of a branch's step, else ""."""
    for name in objects:
        if name not in state and not (branch and fresh_optimizer and _is_optimizer(objects[name])):
            raise RuntimeError(f"resume path {where} holds no state for {name!r}")
    diffs: dict[str, ModuleDiff] = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            # Against this rank's part: an FSDP2 module's state is DTensors, saved as local shards.
            diff = module_diff(state[name], sharded_state.localize(obj.state_dict()))
            if diff:
                diffs[name] = diff
    if diffs and strict:
        raise CheckpointMismatch(_mismatch_text(diffs, where))
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            _load_module(name, obj, state[name], diffs.get(name))
        elif _is_optimizer(obj):
            if branch and fresh_optimizer:
                _note(f"{name}: not restored (--fresh-optimizer); it starts afresh from your code")
                continue
            if diffs:
                raise CheckpointMismatch(
                    f"{name}: your model changed ({', '.join(diffs)}), so the checkpoint's optimizer "
                    "state no longer lines up with its parameters; branch with --fresh-optimizer "
                    "to restore the weights only")
            _load_optimizer(name, obj, state[name], keep_code_settings=bool(branch))
        else:
            kept = list(getattr(obj, "base_lrs", None) or []) if branch and _is_scheduler(obj) else None
            obj.load_state_dict(sharded_state.globalize(state[name], obj))
            if kept is not None:
                obj.base_lrs = kept
                _note(f"{name}: base learning rates kept from your code: {_values(kept)}")
    return list(diffs)


def _load_module(name: str, module: torch.nn.Module, saved: dict, diff: ModuleDiff | None) -> None:
    if diff is None:
        module.load_state_dict(sharded_state.globalize(saved, module))
        return
    reshaped = {key for key, _, _ in diff.reshaped}
    kept: Any = type(saved)((k, v) for k, v in saved.items() if k not in reshaped and k not in diff.unexpected)
    if hasattr(saved, "_metadata"):
        kept._metadata = saved._metadata
    module.load_state_dict(sharded_state.globalize(kept, module), strict=False)
    _note(f"{name}: restored with strict=False, keys as your code initialised them: "
          f"{diff.summary()}")


def _load_optimizer(name: str, optimizer: torch.optim.Optimizer, saved: dict, keep_code_settings: bool) -> None:
    code = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(sharded_state.globalize(saved, optimizer))
    except ValueError as error:  # another number of groups or of parameters in one
        raise CheckpointMismatch(f"{name}: {error}; branch with --fresh-optimizer to restore the "
                                 "weights only") from None
    if not keep_code_settings:
        return
    changed = []
    for index, (group, settings) in enumerate(zip(optimizer.param_groups, code, strict=True)):
        for key, value in settings.items():
            if group.get(key) != value:
                changed.append(f"{key} {_value(group.get(key))} -> {_value(value)}"
                               + (f" (group {index})" if len(code) > 1 else ""))
            group[key] = value
    if changed:
        _note(f"{name}: settings kept from your code, not the checkpoint: {', '.join(changed)}")


def _mismatch_text(diffs: dict[str, ModuleDiff], where: str) -> str:
    first = "; ".join(f"{name}: {diff.summary()}" for name, diff in diffs.items())
    lines = [f"checkpoint {where} does not fit your code: {first}. Restore what matches with "
             "ckpt.restore(strict=False) (the rest keeps your code's initial values); add "
             "--fresh-optimizer to restore the weights only"]
    for name, diff in diffs.items():
        lines.append(f"{name}:")
        lines.extend(diff.lines())
    return "\n".join(lines)


def _names(keys: list[str], shown: int) -> str:
    head = ", ".join(keys[:shown])
    return head + (f" (+{len(keys) - shown} more)" if len(keys) > shown else "")


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def _values(values: list) -> str:
    return ", ".join(_value(v) for v in values)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler)


def _note(message: str) -> None:
    print(f"jupyter_dlc: {message}", file=sys.stderr, flush=True)
