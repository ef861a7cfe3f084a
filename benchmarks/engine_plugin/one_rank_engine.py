"""An engine for benchmarks/ingest.py only. The job's spec names the simulated world (say
512 nodes x 8), which the launcher checks every report's rank against and sizes the ranks
table by; this machine runs one process of it, node 0's first rank, as the local engine runs
a 1x1 job. Every method the engine contract passes the job's spec or attempt to sees a 1x1
spec. Registered by the entry point in one_rank_engine-0.1.dist-info, found on PYTHONPATH
(as tests/engine_plugin's engine is)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jupyter_dlc.engines.contract import AttemptContext
from jupyter_dlc.engines.local import LocalEngine
from jupyter_dlc.spec import JobSpec

NAME = "bench-one-rank"


def _one(spec: JobSpec) -> JobSpec:
    return replace(spec, nodes=1, nproc_per_node=1)


def _ctx(ctx: AttemptContext) -> AttemptContext:
    # The environment too: a standby agent forks as many warm ranks as DLC_NPROC_PER_NODE says.
    return replace(ctx, spec=_one(ctx.spec), env=dict(ctx.env, DLC_NNODES="1", DLC_NPROC_PER_NODE="1"))


class OneRankEngine(LocalEngine):
    name = NAME
    # Its simulated ranks run nowhere: admission counts none of them against this machine's
    # process slots (its one process is the benchmark's own).
    ranks_here = False

    def capacity_error(self, spec: JobSpec) -> str | None:
        return super().capacity_error(_one(spec))

    def dry_run(self, ctx):
        return super().dry_run(_ctx(ctx))

    def submit(self, ctx, request):
        return super().submit(_ctx(ctx), request)

    def adopt(self, ctx):
        return super().adopt(_ctx(ctx))

    def describe(self, ctx, handle):
        return super().describe(_ctx(ctx), handle)

    def stop(self, ctx, handle, grace):
        return super().stop(_ctx(ctx), handle, grace)

    def kill(self, ctx, handle):
        return super().kill(_ctx(ctx), handle)

    def cleanup(self, ctx, handle):
        return super().cleanup(_ctx(ctx), handle)

    def start_standby(self, ctx):
        return super().start_standby(_ctx(ctx))

    def standby_started(self, ctx):
        return super().standby_started(_ctx(ctx))

    def node_host(self, ctx, handle, node):
        return super().node_host(_ctx(ctx), handle, node)

    def logs(self, ctx, handle, *args: Any, **kwargs: Any):
        return super().logs(_ctx(ctx), handle, *args, **kwargs)
