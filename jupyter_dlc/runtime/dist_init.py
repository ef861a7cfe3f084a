"""Build the process group from the injected environment.

Why not plain `init_process_group(init_method="env://")`: after a torchrun in-agent restart,
the new workers reuse the agent's store and trip over the previous attempt's keys (gloo
connectFullMesh: connection refused, see FIELD-NOTES). Prefixing every key with the restart
count and our attempt number gives each attempt a clean namespace in the same store.
Scripts that call `init_process_group` themselves keep working: nothing else in the runtime
requires `init()`.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ..shims import torch_private
from . import breakdown
from .env import rank_info
from .report import get_reporter

_store = None


def init(backend=None, timeout=None, total_steps=None):
    """Join the job's process group (once; later calls just return the rank facts).

    backend: "nccl" when CUDA is available, else "gloo". timeout: seconds for collectives,
    default DLC_COLLECTIVE_TIMEOUT. total_steps: the steps the script will run, for the
    views' progress and ETA (rank 0 reports it). Returns a RankInfo. Starts the step
    breakdown's timing of DataLoader waits and of every DDP built afterwards (breakdown.py).
    """
    global _store
    info = rank_info()
    breakdown.install()  # DataLoader waits and DDP's gradient sync, timed from here on
    if total_steps is not None:
        report_total_steps(info, total_steps)
    if dist.is_available() and not dist.is_initialized():
        use_cuda = torch.cuda.is_available()
        backend = backend or ("nccl" if use_cuda else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(info.local_rank)
        collective_timeout = timedelta(seconds=timeout or info.collective_timeout)
        _store = _attempt_store(info, collective_timeout)
        dist.init_process_group(backend=backend, store=_store, rank=info.rank,
                                world_size=info.world_size, timeout=collective_timeout)
    return info


def _attempt_store(info, timeout):
    if "MASTER_ADDR" not in os.environ:
        # A script run by plain `python`: a world of one needs no rendezvous.
        return dist.HashStore()
    # Under torchrun the agent already hosts the store on MASTER_PORT; otherwise rank 0 does.
    agent_hosts_store = torch_private.agent_hosts_store()
    tcp_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
        is_master=(info.rank == 0 and not agent_hosts_store), timeout=timeout,
        wait_for_workers=False)
    return dist.PrefixStore(f"attempt{info.restart_count}-{info.attempt}", tcp_store)


def group_settled():
    """Whether job_store()'s answer is final: the group is up, or the job has one rank."""
    return rank_info().world_size <= 1 or (dist.is_available() and dist.is_initialized())


def job_store():
    """The store every rank of this attempt shares, or None in a world of one.

    Ours when `init()` built the group, else the one `init_process_group` made.
    """
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return _store if _store is not None else torch_private.default_store()


def report_total_steps(info, total_steps):
    """Tell the launcher how many steps the job runs ("step 256 / 400, ETA 7 s")."""
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"runtime.init: total_steps must be a whole number of at least 1, "
                         f"got {total_steps!r:.60}")
    reporter = get_reporter()
    if reporter is not None and info.rank == 0:
        reporter.event("total_steps", steps=total_steps)
