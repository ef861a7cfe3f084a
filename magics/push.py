"""Values, not code: what can be sent to the ranks, how big it is, and writing it out.

A pushed value is serialized once in the kernel and loaded on every rank. Tensors, modules
and containers holding them go through `torch.save` (so storages are written compactly and
the file is what torch users expect); anything else through `pickle`. Classes and functions
defined in the notebook are pickled *by name* (`__main__.Net`), so the capture must also
bring their definitions into the script: `serialize` reports which ones a value refers to.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import sys
import threading
import types

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class Unsendable(Exception):
    """The value cannot travel to the ranks; `what` describes it, `advice` says what to do."""

    def __init__(self, what: str, advice: str):
        super().__init__(what)
        self.what = what
        self.advice = advice


def type_name(value) -> str:
    cls = type(value)
    module = {"_io": "io", "builtins": ""}.get(cls.__module__, cls.__module__)
    return f"{module}.{cls.__qualname__}" if module else cls.__qualname__


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover - loop always returns


def check_kind(value, verb: str = "create") -> None:
    """Refuse, by kind, values whose meaning is tied to this process, before trying pickle."""
    if isinstance(value, io.IOBase):
        raise Unsendable(f"an open file ({type_name(value)})", "open it inside the %%dlc cell")
    if isinstance(value, (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)):
        raise Unsendable(f"a generator ({type_name(value)})", f"{verb} it inside the %%dlc cell")
    if isinstance(value, socket.socket):
        raise Unsendable(f"a socket ({type_name(value)})", "open it inside the %%dlc cell")
    if isinstance(value, _LOCK_TYPES):
        raise Unsendable(f"a lock ({type_name(value)})", f"{verb} it inside the %%dlc cell")
    if isinstance(value, threading.Thread):
        raise Unsendable(f"a thread ({type_name(value)})", "start it inside the %%dlc cell")
    if isinstance(value, types.ModuleType):
        raise Unsendable(f"a module ({value.__name__})", "import it inside the %%dlc cell")


def _torch():
    # Only a torch the kernel already imported matters: a value cannot hold tensors otherwise.
    return sys.modules.get("torch")


def inspect_value(value, limit: int = 1 << 62) -> tuple[int, bool]:
    """(bytes of array data the value holds, whether it holds tensors or modules).

    Counts storages once each, so views and shared weights are not double counted; stops
    walking once past `limit`, since then the value is refused anyway.
    """
    torch = _torch()
    seen: set[int] = set()
    total = 0
    has_torch = False
    stack = [(value, 0)]
    visited = 0
    while stack and total <= limit and visited < 100_000:
        item, depth = stack.pop()
        visited += 1
        if torch is not None and isinstance(item, torch.nn.Module):
            has_torch = True
            stack.extend((t, depth + 1) for t in item.state_dict().values())
        elif torch is not None and isinstance(item, torch.Tensor):
            has_torch = True
            try:
                storage = item.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
            except Exception:  # sparse, meta or otherwise storage-less tensors
                key, size = id(item), item.nelement() * item.element_size()
            if key not in seen or key == 0:
                seen.add(key)
                total += size
        elif hasattr(item, "nbytes") and hasattr(item, "dtype"):  # numpy and friends
            total += int(item.nbytes)
        elif isinstance(item, (bytes, bytearray, str)):
            total += len(item)
        elif depth < 6 and isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif depth < 6 and isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in item)
    return total, has_torch


class _Sink:
    def write(self, data) -> int:
        return len(data)


class _Finder(pickle.Pickler):
    """Pickles into nothing, noting the notebook classes and functions met on the way."""

    def __init__(self):
        super().__init__(_Sink(), protocol=pickle.HIGHEST_PROTOCOL)
        self.main_names: dict[str, None] = {}
        torch = _torch()
        self._storages = (torch.UntypedStorage, torch.TypedStorage) if torch is not None else ()

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.main_names.setdefault(obj.__qualname__.split(".")[0])
        return NotImplemented

    def persistent_id(self, obj):
        # Skip tensor bytes: this pass only looks for references and refusals.
        if self._storages and isinstance(obj, self._storages):
            return "storage"
        return None


def main_references(value) -> list[str]:
    """Top-level names of notebook classes/functions the value's pickle refers to.

    Raises Unsendable when the value cannot be pickled at all.
    """
    check_kind(value)
    finder = _Finder()
    try:
        finder.dump(value)
    except Exception as exc:  # pickle raises TypeError, PicklingError, AttributeError...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Unsendable(
            f"a value that cannot be pickled ({type_name(value)}: {reason})",
            "create it inside the %%dlc cell",
        ) from None
    return list(finder.main_names)


def write_value(name: str, value, staging_dir: str, limit: int) -> str:
    """Serialize to `staging_dir/NAME.pt|.pkl` and return the path; refuse above `limit`."""
    advice = (f"write it to shared storage (e.g. torch.save({name}, '/shared/{name}.pt')) and "
              "load it inside the cell")
    nbytes, has_torch = inspect_value(value, limit)
    if nbytes > limit:
        raise Unsendable(f"at least {human_size(nbytes)} of data (limit {human_size(limit)})", advice)
    os.makedirs(staging_dir, exist_ok=True)
    path = os.path.join(staging_dir, f"{name}.pt" if has_torch else f"{name}.pkl")
    if has_torch:
        _torch().save(value, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    size = os.path.getsize(path)
    if size > limit:
        os.unlink(path)
        raise Unsendable(f"{human_size(size)} serialized (limit {human_size(limit)})", advice)
    return path


# The loader the script runs on every rank, after the captured code (so that the notebook
# classes a pickle names exist in __main__) and before the cell. Under the launcher the
# pushed files are in $DLC_JOB_DIR/files; an exported bundle run by hand keeps them in
# files/ beside the script. Tensors land on the CPU: each rank moves them to its own device.
LOADER = '''\
def _dlc_load(name):
    import os
    path = os.path.join(os.environ.get("DLC_JOB_DIR") or ".", "files", name)
    if not os.path.exists(path):
        here = os.path.dirname(os.path.abspath(globals().get("__file__") or "."))
        path = os.path.join(here, "files", name)
    if name.endswith(".pt"):
        import torch
        return torch.load(path, map_location="cpu", weights_only=False)
    import pickle
    with open(path, "rb") as f:
        return pickle.load(f)
'''
