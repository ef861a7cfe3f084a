"""torch's private APIs and undocumented behaviour, in one place.

- `torch.distributed.distributed_c10d._get_default_store()`: the store `init_process_group`
  built, when the user's script built the group itself (the Checkpointer shares a token
  through it).
- `TORCHELASTIC_USE_AGENT_STORE`: set by torchrun's agent to "True" when the agent already
  hosts the TCPStore on MASTER_PORT, so rank 0 must connect instead of hosting one.
- The text of torchrun's failure summary and of its agent's log lines ("Root Cause (first
  observed failure)", the `rank : N (local_rank: M)` / `exitcode : C (pid: P)` blocks, "Sending
  process P closing signal", "Received SIGTERM death signal"), parsed by the launcher.
- DDP's reducer: after its first iteration DDP rebuilds its gradient buckets in the order
  gradients became ready (`reducer._rebuild_buckets()`); the layout decides the order of the
  floating-point sums in the all-reduce. `bucket_layout` reads it
  (`reducer._get_zeros_like_grad_buckets()`), `install_bucket_layout` builds a new reducer
  with it through DDP's own `_ddp_init_helper`, with `dist._compute_bucket_assignment_by_size`
  answering the saved layout for that one call.
- torchrun's agent starts every worker with `subprocess.Popen` inside
  `SubprocessHandler._popen(args, env)` (torch.distributed.elastic.multiprocessing.
  subprocess_handler); `route_worker_starts` lets a standby agent hand a worker to a rank
  process it forked ahead of time instead (node/warm_ranks.py).
- The step breakdown (runtime/breakdown.py): every DataLoader iterator's `__next__` is
  `torch.utils.data.dataloader._BaseDataLoaderIter.__next__` (its subclasses, single and
  multi-process, override `_next_data` only), which `time_dataloader_next` wraps. DDP's
  gradient all-reduce runs inside the C++ reducer; `time_ddp_sync` wraps
  `DistributedDataParallel.__init__` to register, straight on the new reducer
  (`dist._register_comm_hook`, not counted in `ddp._comm_hooks`), one Python communication
  hook that times each bucket's future and runs the user's hook inside: a later
  `register_comm_hook` (or `_register_builtin_comm_hook`) becomes that inner hook, as the
  reducer takes one hook only (`_check_comm_hook`, `logger._set_comm_hook_name` and
  `_comm_hooks` kept as DDP's own method keeps them). `GradBucket.is_last()` marks the
  bucket DDP reduces last in an iteration. DDP's default mean goes through the process
  group's own `allreduce([tensor])`, and a Python hook's future must hold a Python object
  (DDP's PythonCommHook parses it so): hence one `then` a bucket. That hook is for CUDA; a
  CPU DDP is timed by `time_cpu_ddp_sync` instead: autograd's final callbacks
  (`torch.autograd.Variable._execution_engine.queue_callback`, run in the order queued once
  a backward's graph is done), queued from a `register_post_accumulate_grad_hook` on the
  first parameter (a tensor's own post-accumulate hooks run inside AccumulateGrad, before
  the reducer's post hook on it, which queues DDP's finalisation when the last gradient is
  ready).

- The NCCL flight recorder's dump, `torch._C._distributed_c10d._dump_fr_trace_json(
  includeCollectives, onlyActive)` (bytes of JSON; torch 2.13 has it, CPU builds too, empty
  there): `nccl_flight_recorder` reads it for the evidence kept before a kill
  (launcher/evidence.py), only in a process whose default group runs NCCL, and never
  imports torch (the reporter thread calls it while the main thread may hold any lock).

Text patterns need no torch; the functions import it when called (the launcher never does).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"

# torchrun's failure summary, as torch.distributed.elastic.multiprocessing.errors prints it.
SUMMARY_ROOT_CAUSE = "Root Cause"
SUMMARY_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
SUMMARY_RANK_EXIT = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
SUMMARY_BLOCK_START = re.compile(r"^\s*\[\d+\]:\s*$")
# The agent's own log lines.
AGENT_CLOSED = re.compile(r"Sending process (\d+) closing signal|Unable to shutdown process (\d+)")
AGENT_DEATH = re.compile(r"Received (\d+|\w+) death signal|SignalException: Process \d+ got signal")


def flight_recorder_dump() -> Any:
    """torch's flight recorder dump function, or None where this torch has none (or torch
    was not imported by the process)."""
    import sys

    c10d = sys.modules.get("torch._C._distributed_c10d")
    return getattr(c10d, "_dump_fr_trace_json", None)


def nccl_flight_recorder() -> str | None:
    """The NCCL flight recorder's active collectives as JSON text, where this process's
    default group runs NCCL; None elsewhere, and on any error."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "nccl":
            return None
        dump = flight_recorder_dump()
        return None if dump is None else dump(True, True).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - evidence must never break the rank's answer
        return None


def agent_hosts_store() -> bool:
    """Whether torchrun's agent hosts the rendezvous store (rank 0 must not host another)."""
    return os.environ.get(AGENT_STORE_ENV) == "True"


def default_store() -> Any:
    """The store of the default process group."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def route_worker_starts(start) -> None:
    """In this process, torchrun's agent asks `start(args, env, stdout, stderr)` for each
    worker first; it returns a Popen-like object (pid, poll, wait), or None for torchrun's
    own Popen. `stdout`/`stderr` are the files torchrun opened for redirects, or None."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler as handler,
    )

    original = handler.SubprocessHandler._popen

    def _popen(self, args, env):
        proc = start(tuple(args), env, self._stdout, self._stderr)
        return proc if proc is not None else original(self, args, env)

    handler.SubprocessHandler._popen = _popen  # type: ignore[method-assign]


# -- DDP's gradient bucket layout ----------------------------------------------------------

def is_ddp(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(module, DistributedDataParallel)


def layout_blocker(ddp: Any) -> str | None:
    """Why this DDP's bucket layout cannot be carried across a restart, or None."""
    if getattr(ddp, "_use_python_reducer", False):
        return "it runs the Python reducer (compiled autograd), whose buckets live elsewhere"
    if getattr(ddp, "_comm_hooks", None):
        return "a communication hook is registered; restore() must come before register_comm_hook()"
    return None


def bucket_layout(ddp: Any) -> list[list[int]] | None:
    """DDP's rebuilt bucket layout: per bucket, in the reducer's order, the indices of its
    parameters in DDP's parameter list; None while DDP has not rebuilt (it never does with
    find_unused_parameters=True, and not before one full iteration).

    Rebuilds now, if the reducer has recorded an iteration but not rebuilt yet: DDP would do
    exactly this at the next forward; doing it here lets a checkpoint taken after the first
    iteration hold the layout every later step uses. Every rank saves at the same step, so
    the rebuild's broadcast of rank 0's layout pairs up.
    """
    if not getattr(ddp, "_has_rebuilt_buckets", False):
        if not ddp.reducer._rebuild_buckets():
            return None
        ddp._has_rebuilt_buckets = True
    return reducer_buckets(ddp)


def reducer_buckets(ddp: Any) -> list[list[int]]:
    """The reducer's buckets as they are now: parameter indices, bucket by bucket."""
    params, _ = ddp._build_params_for_reducer()
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket.parameters()]
            for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def install_bucket_layout(ddp: Any, layout: list[list[int]]) -> None:
    """Replace DDP's reducer by one built with `layout` (from bucket_layout), before the
    first forward of this process: its first step then sums in the same order as the steps
    of the run that saved it. The new reducer rebuilds after its first iteration as DDP's
    always does; the ready order is the model's, so it rebuilds to this same layout."""
    import torch.distributed as dist

    params, expect_sparse = ddp._build_params_for_reducer()
    if sorted(i for bucket in layout for i in bucket) != list(range(len(params))):
        raise ValueError(f"the saved bucket layout covers other parameters than this model's {len(params)}")
    mapping = ddp._build_debug_param_to_name_mapping(params)
    limits = [ddp.bucket_bytes_cap] * len(layout)
    original = dist._compute_bucket_assignment_by_size

    def saved_assignment(*args: Any, **kwargs: Any) -> tuple[list[list[int]], list[int]]:
        # _ddp_init_helper reverses what this returns (its guess at the backward order).
        return [list(b) for b in reversed(layout)], list(reversed(limits))

    ddp.reducer._remove_autograd_hooks()
    dist._compute_bucket_assignment_by_size = saved_assignment
    try:
        ddp._ddp_init_helper(params, expect_sparse, mapping, ddp.static_graph)
    finally:
        dist._compute_bucket_assignment_by_size = original
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()
    ddp._has_rebuilt_buckets = False
    timed = getattr(ddp, _SYNC_HOOK, None)
    if timed is not None:  # the new reducer has no hook: give it the timing one again
        dist._register_comm_hook(ddp.reducer, None, timed)


# -- the step breakdown: DataLoader waits and DDP's gradient sync ------------------------

_TIMED = "_dlc_timed"
_SYNC_HOOK = "_dlc_sync_hook"
_SYNC_INNER = "_dlc_sync_inner"


def dataloader_iterator_class() -> Any:
    from torch.utils.data import dataloader

    return dataloader._BaseDataLoaderIter


def time_dataloader_next(wrap: Any) -> None:
    """From now on every torch DataLoader iterator's `__next__` is `wrap(original)` (a
    function of the iterator). Idempotent; `untime_dataloader_next` undoes it."""
    cls = dataloader_iterator_class()
    original = cls.__dict__["__next__"]
    if getattr(original, _TIMED, False):
        return
    timed = wrap(original)
    setattr(timed, _TIMED, original)
    cls.__next__ = timed


def untime_dataloader_next() -> None:
    cls = dataloader_iterator_class()
    original = getattr(cls.__dict__["__next__"], _TIMED, None)
    if original:
        cls.__next__ = original


def _allreduce_future(process_group: Any, bucket: Any) -> Any:
    """DDP's default reduction, the mean over the group, started: its future's value is
    [the bucket's tensor]."""
    import torch.distributed as dist

    group: Any = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    # The process group's own allreduce: dist.all_reduce's Python checks cost ~30 us a call.
    return group.allreduce([tensor]).get_future()


def _allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """DDP's default reduction as a Python hook."""
    return _allreduce_future(process_group, bucket).then(lambda fut: fut.value()[0])


def time_cpu_ddp_sync(ddp: Any, on_sync: Any) -> Any:
    """Call `on_sync(seconds)` after each synchronised backward of a CPU DDP with its exposed
    gradient all-reduce: from the end of backward's compute (the last gradient ready, when DDP
    launches the last bucket) to the end of DDP's finalisation (the wait for the last bucket's
    reduction), which is DDP's own definition of it (its logger's backward_compute_time_end
    to backward_comm_time_end), without its logger.

    How: a post-accumulate-grad hook on the module's first parameter, whose gradient is the
    backward's last in most models, notes the time. A parameter's own hooks run before the
    reducer's hook on its gradient accumulator, so the clock starts before DDP launches that
    bucket. (Started later, at an autograd final callback, it missed the reduction's first
    milliseconds whenever the loop's thread came to it late, waiting for the GIL or a core
    while gloo's thread was already reducing: 8% short on average on a loaded host, 25% once
    in CI.) The hook then queues a "final callback", which autograd runs once the backward's
    graph is done, in the order queued; it is queued ahead of DDP's finalisation and queues
    a second one, which runs after it and reads the clock. A backward without DDP's reduction
    (no_sync) measures the few microseconds of backward after that gradient; one in which
    that parameter gets no gradient measures nothing. About 10 us a step cold; reading DDP's
    own timers every step cost 70. Returns the hook's handle (`remove()` it to stop), or
    None."""
    import torch

    queue = torch.autograd.Variable._execution_engine.queue_callback
    clock = time.perf_counter
    started = [0.0]

    def ended() -> None:
        on_sync(clock() - started[0])

    def graph_done() -> None:
        queue(ended)  # behind DDP's finalisation

    def gradient_accumulated(_param: Any) -> None:
        started[0] = clock()  # before the reducer's hook launches this gradient's bucket
        # A leaf's gradient is accumulated once a backward: one callback pair a backward,
        # and none left queued by a backward that failed half-way.
        queue(graph_done)

    # The first parameter: most models use their input layer's in every backward (an output
    # head may sit unused, as a pretrained pooler does); one hook, as it runs every step.
    first = next((p for p in ddp.module.parameters() if p.requires_grad), None)
    return None if first is None else first.register_post_accumulate_grad_hook(gradient_accumulated)


def time_ddp_sync(clock_for: Any, on_cpu: Any = None) -> None:
    """Every DistributedDataParallel built from now on reduces through a hook that tells
    `clock_for(ddp)` (an object with `launched(bucket)` returning a token and `done(token)`)
    when each bucket's reduction starts and ends. With `on_cpu(seconds)`, a DDP on CPU gets
    no hook: `time_cpu_ddp_sync` times its exposed reduction for `on_cpu` (on a 10 ms CPU
    step a Python comm hook cost 4-9%, two GIL hand-overs a bucket; on CUDA the hook's
    events are read without a synchronise).
    Idempotent."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP.__init__, _TIMED, False):
        return
    original_init = DDP.__init__
    original_register = DDP.register_comm_hook
    original_builtin = DDP._register_builtin_comm_hook

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        reducer = getattr(self, "reducer", None)
        if reducer is None or getattr(self, "_use_python_reducer", False):
            return
        if on_cpu is not None and getattr(self, "device_type", None) == "cpu":
            time_cpu_ddp_sync(self, on_cpu)
            return
        clock = clock_for(self)

        def timed(state: Any, bucket: Any) -> Any:
            inner = getattr(self, _SYNC_INNER, None)
            token = clock.launched(bucket)
            if inner is None:  # DDP's own mean, with one callback (one GIL hand-over) a bucket
                fut, first = _allreduce_future(self.process_group, bucket), True
            else:
                fut, first = inner[0](inner[1], bucket), False

            def done(fut: Any) -> Any:
                clock.done(token)
                return fut.value()[0] if first else fut.value()

            return fut.then(done)

        import torch.distributed as dist

        dist._register_comm_hook(reducer, None, timed)
        setattr(self, _SYNC_HOOK, timed)

    def register_comm_hook(self: Any, state: Any, hook: Any) -> None:
        if getattr(self, _SYNC_HOOK, None) is None:
            return original_register(self, state, hook)
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        setattr(self, _SYNC_INNER, (hook, state))

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        if getattr(self, _SYNC_HOOK, None) is None:
            return original_builtin(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {dist.BuiltinCommHookType.ALLREDUCE: _allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        if comm_hook_type not in hooks:
            raise ValueError(f"built-in communication hook {comm_hook_type} is not known to "
                             "the step breakdown; set DLC_STEP_BREAKDOWN=0 to use it")
        self.logger._set_comm_hook_name(str(comm_hook_type))
        setattr(self, _SYNC_INNER, (hooks[comm_hook_type], self.process_group))

    for name, patched, original in (("__init__", __init__, original_init),
                                    ("register_comm_hook", register_comm_hook, original_register),
                                    ("_register_builtin_comm_hook", _register_builtin_comm_hook,
                                     original_builtin)):
        setattr(patched, _TIMED, original)
        setattr(DDP, name, patched)


def untime_ddp_sync() -> None:
    """DDPs built from now on reduce as torch does (those built already keep their hook)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name in ("__init__", "register_comm_hook", "_register_builtin_comm_hook"):
        original = getattr(DDP.__dict__[name], _TIMED, None)
        if original:
            setattr(DDP, name, original)
