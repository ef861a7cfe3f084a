"""The step broken down: where each step's wall time went on this rank.

One step is the time between two consecutive `runtime.log` calls. At each call the runtime
adds to the step's values, as ordinary metrics in milliseconds (the same entry, so a report
carries no more entries than before, and the launcher stores and serves them like any
metric):

- `step_ms`: the step's wall time;
- `data_wait_ms`: time blocked in a torch DataLoader iterator's `__next__` (a shim wraps it
  at `runtime.init()` or the first `log()`), plus sections in `with runtime.timer("data"):`
  for loaders that are not torch's (nested sections count once; like every section here,
  only on the thread that calls `runtime.log`: a prefetch thread's waits block no one);
- `grad_sync_ms`: DDP's gradient all-reduce as the loop sees it: from the moment backward
  has computed every gradient (and DDP launches the last bucket) to the completion of the
  last bucket's reduction. That is the exposed communication, the time backward waits in
  DDP's finalisation, including the wait for a slower peer; reductions that overlap
  backward's compute are not counted twice. On CPU no hook: a post-accumulate-grad hook on
  the module's first parameter starts the clock and two autograd final callbacks read it
  after DDP's finalisation (`torch_private.time_cpu_ddp_sync`; on a 10 ms step a Python comm
  hook cost 4-9%, DDP's own timers 70 us a read). On CUDA a timing comm hook records two CUDA
  events, read at a later boundary once the device passed them (`query()`, never a
  synchronise; DDP's own CUDA timers synchronise an event at each read);
- `ckpt_stall_ms`: time the loop spent in the Checkpointer's `save()` and `wait()`.

Compute is the rest and is not sent. A value the script logs itself under one of these
names wins for that step. `runtime.timer(name)` for any other name logs `<name>_ms` (e.g.
`h2d_ms`), time that stays part of compute in the chart. The first `log()` closes no step
(there is no earlier boundary), so it carries none of these. DLC_STEP_BREAKDOWN=0 turns it
all off (then DDP and the DataLoader are left exactly as torch has them); it is read once,
when this module is imported.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from .. import layout
from ..shims import torch_private

STEP, DATA_WAIT, GRAD_SYNC, CKPT_STALL = "step_ms", "data_wait_ms", "grad_sync_ms", "ckpt_stall_ms"
RESERVED = (STEP, DATA_WAIT, GRAD_SYNC, CKPT_STALL)
ENV = "DLC_STEP_BREAKDOWN"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OWN_NAMES = {"data": DATA_WAIT, "step": None, "data_wait": None, "grad_sync": None,
              "ckpt_stall": None}

_clock = time.perf_counter
_get_ident = threading.get_ident
_lock = threading.Lock()
# Seconds in this step added from threads other than the loop's: a CPU DDP whose backward
# runs off the loop's thread, or a DDP on a device neither CPU nor CUDA (its hook's future
# completes on a communication thread). The loop's own thread adds to its _Section's
# `spent`, without a lock (the common case; a CUDA DDP's events are read there too).
_sums: dict[str, float] = {}
# Every name of a runtime.timer section this rank has timed but the breakdown's own: each
# step carries all of them (0 where the step had none).
_seen: list[str] = []
_cuda_pending: list[tuple[Any, Any]] = []  # (start, end) CUDA events not read yet
_last_boundary: float | None = None
_installed = False
_on = not layout.switched_off(os.environ.get(ENV))  # read once: log() runs every step


def enabled() -> bool:
    return _on


def switch(on: bool) -> None:
    """Turn the breakdown on or off from now on, as DLC_STEP_BREAKDOWN would have at start
    (benchmarks compare a loop with and without it): off also leaves DDPs built from now on
    and the DataLoader as torch has them."""
    global _on, _last_boundary
    _on, _last_boundary = bool(on), None
    if on:
        install()
    else:
        uninstall()


def _add(name: str, seconds: float) -> None:
    with _lock:
        if name not in _sums:
            if name not in _seen and name not in RESERVED:
                _seen.append(name)
            _sums[name] = 0.0
        _sums[name] += seconds


# The thread whose time the sections count: the one that calls runtime.log (the main
# thread until the first call). A loader's prefetch thread, or a save on another thread,
# does not block the loop.
_loop_thread = threading.main_thread().ident


class _Section:
    """Times the outermost of nested `with` blocks of one name into that metric, on the
    loop's thread only. Its seconds in this step are `spent`, a plain attribute: only the
    loop's thread adds to it and end_step (on that thread) takes it, so no lock is needed
    (the lock and dict of `_add` took 5 us of each DataLoader next() against 1.8 here, in a
    loop that evicts this code from the caches between steps)."""

    __slots__ = ("name", "depth", "started", "spent")

    def __init__(self, name: str):
        self.name, self.depth, self.started, self.spent = name, 0, 0.0, 0.0

    def __enter__(self) -> _Section:
        if threading.get_ident() == _loop_thread:
            self.depth += 1
            if self.depth == 1:
                self.started = _clock()
        return self

    def __exit__(self, *exc: Any) -> None:
        if threading.get_ident() == _loop_thread:
            self.depth -= 1
            if self.depth == 0:
                self.spent += _clock() - self.started

    def add(self, seconds: float) -> None:
        """Seconds measured elsewhere (a CPU DDP's sync, timed by autograd callbacks that run
        on the thread calling backward): lockless on the loop's thread, else through `_add`."""
        if _get_ident() == _loop_thread:
            self.spent += seconds
        else:
            _add(self.name, seconds)

    def around(self, call: Any) -> Any:
        """`call` (a function of one argument) run as inside `with self:`, in fewer steps: a
        DataLoader's __next__ runs every step (boundary.log's docstring says why it counts)."""
        section = self

        def timed(arg: Any) -> Any:
            if section.depth or _get_ident() != _loop_thread:
                return call(arg)
            section.depth = 1
            started = _clock()
            try:
                return call(arg)
            finally:
                section.depth = 0
                section.spent += _clock() - started

        return timed


_sections: dict[str, _Section] = {name: _Section(name) for name in (DATA_WAIT, CKPT_STALL, GRAD_SYNC)}
# The same sections as a tuple, which end_step walks every step: a timer() made on another
# thread meanwhile replaces it rather than changing what is being walked.
_every_section = tuple(_sections.values())


def timer(name: str) -> _Section:
    """`with runtime.timer("data"):` adds the block's time to this step's `data_wait_ms`;
    any other name N to `N_ms` (a metric of its own, part of compute in the chart)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"runtime.timer: name must be an identifier such as 'data' or 'h2d', got {name!r}")
    metric = _OWN_NAMES.get(name, f"{name}_ms")
    if metric is None:
        raise ValueError(f"runtime.timer: {name!r} is measured by the runtime itself; use "
                         "'data' for input waits, or another name of your own")
    global _every_section
    section = _sections.get(metric)
    if section is None:
        with _lock:
            section = _sections.setdefault(metric, _Section(metric))
            _every_section = tuple(_sections.values())
    return section


def checkpoint_stall() -> _Section:
    return _sections[CKPT_STALL]


class _SyncClock:
    """One DDP's gradient reductions: the exposed part of each iteration's (module doc)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outstanding = 0
        self.start: Any = None  # the last bucket's launch: perf_counter, or a CUDA event

    def launched(self, bucket: Any) -> bool:
        cuda = bucket.buffer().is_cuda
        with self.lock:
            self.outstanding += 1
            if bucket.is_last():
                self.start = _cuda_event() if cuda else _clock()
        return cuda

    def done(self, cuda: bool) -> None:
        with self.lock:
            self.outstanding -= 1
            if self.outstanding or self.start is None:
                return
            start, self.start = self.start, None
        if cuda:
            with _lock:
                _cuda_pending.append((start, _cuda_event()))
        else:
            _add(GRAD_SYNC, _clock() - start)


def _cuda_event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _read_cuda_pending() -> None:
    """Add the CUDA-timed syncs the device has passed; the others wait for a later step."""
    with _lock:
        pending, _cuda_pending[:] = list(_cuda_pending), []
    later = []
    for start, end in pending:
        if end.query():
            _sections[GRAD_SYNC].add(start.elapsed_time(end) / 1e3)
        else:
            later.append((start, end))
    if later:
        with _lock:
            _cuda_pending[:0] = later


_add_sync = _sections[GRAD_SYNC].add  # a CPU DDP's exposed sync


def time_ddp(ddp: Any) -> Any:
    """Time the gradient sync of a CPU DDP built before `install()` as one built after it is
    timed; returns the handle to `remove()` it with (None for a DDP that is not on CPU)."""
    if getattr(ddp, "device_type", None) != "cpu":
        return None
    return torch_private.time_cpu_ddp_sync(ddp, _add_sync)


def install() -> None:
    """Time DataLoader waits and DDP's gradient sync from now on (once; DDPs built before
    this are not timed). Called by `runtime.init()` and the first `runtime.log()`."""
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    try:
        torch_private.time_dataloader_next(_sections[DATA_WAIT].around)
        torch_private.time_ddp_sync(lambda ddp: _SyncClock(), on_cpu=_add_sync)
    except ImportError:
        pass  # no torch: nothing to time but the runtime's own sections


def uninstall() -> None:
    """Leave DataLoader and DDP as torch has them (benchmarks compare with and without)."""
    global _installed
    if _installed:
        torch_private.untime_dataloader_next()
        torch_private.untime_ddp_sync()
        _installed = False


def end_step(now: float) -> tuple[float, dict[str, float]] | None:
    """End the step at `now` (perf_counter): (its seconds, {metric: seconds in it}), or None
    at the first boundary or when turned off. The least a boundary must do at once: log()
    runs it every step, between the script's own work, which has pushed this code's data
    out of the CPU caches; `milliseconds` makes the values later, with the rest of a batch
    (on the reporter's thread)."""
    global _last_boundary, _loop_thread, _sums
    if not _on:
        return None
    _loop_thread = _get_ident()
    last, _last_boundary = _last_boundary, now
    if last is None:
        install()
        with _lock:
            _sums.clear()
        for section in _every_section:
            section.spent = 0.0
        return None
    if _cuda_pending:
        _read_cuda_pending()
    if _sums:
        with _lock:  # _add looks _sums up by name each time: a new dict takes the next step's
            sums, _sums = _sums, {}
    else:
        sums = {}
    for section in _every_section:
        spent = section.spent
        if spent:
            section.spent = 0.0
            name = section.name
            sums[name] = sums.get(name, 0.0) + spent
            if name not in RESERVED and name not in _seen:
                _seen.append(name)
    return now - last, sums


def milliseconds(ended: tuple[float, dict[str, float]]) -> dict[str, float]:
    """A step `end_step` ended, as the metrics log() adds: every breakdown name in ms (0
    where the step had none), and every runtime.timer name this rank has timed."""
    step, sums = ended
    # Whole microseconds: round() to an int and a division take half of round(x, 3)'s time.
    values = {STEP: round(step * 1e6) / 1e3, DATA_WAIT: 0.0, GRAD_SYNC: 0.0, CKPT_STALL: 0.0}
    for name in _seen:
        values[name] = 0.0
    for name, seconds in sums.items():
        values[name] = round(seconds * 1e6) / 1e3
    return values


def with_values(ended: tuple[float, dict[str, float]] | None, values: dict[str, float]) -> dict[str, float]:
    """A step's metrics as sent: the breakdown of `ended` (None: none) and the script's own
    `values`, which win over the breakdown's."""
    if ended is None:
        return values
    merged = milliseconds(ended)
    merged.update(values)
    return merged


def close_step() -> dict[str, float]:
    """This step's breakdown in ms (empty at the first boundary, or when turned off), and the
    start of the next step."""
    ended = end_step(_clock())
    return milliseconds(ended) if ended else {}
