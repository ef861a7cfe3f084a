"""The torchrun command line every engine runs on its nodes, and what torchrun says of its
workers when they fail (the failure summary in each node's log)."""

from __future__ import annotations

import os

from .. import layout
from ..node.standby import cold_argv
from ..shims import torch_private
from ..spec import JobSpec

_SUMMARY_TAIL = 64 * 1024
_SUMMARY_BLOCK = torch_private.SUMMARY_RANK_EXIT


def torchrun_argv(spec: JobSpec, node: int | str, port: int | str, script: str, python: str,
                  master_addr: str = "127.0.0.1") -> list[str]:
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}", f"--node-rank={node}", f"--nproc-per-node={spec.nproc_per_node}",
        f"--master-addr={master_addr}", f"--master-port={port}",
        # The launcher owns restarts (whole-job, resumed from a committed checkpoint).
        "--max-restarts=0", "--monitor-interval=0.1",
        "-m", "jupyter_dlc.runtime.bootstrap", script, *spec.args,
    ]


FORKED_START_ENV = "DLC_FORKED_START"


def forked_start_wanted(spec: JobSpec) -> bool:
    """Whether each node's agent imports torch once and forks its ranks (node/standby.py
    --cold: one torch import a node, not one per rank and one for the agent; the default),
    rather than torchrun starting fresh interpreters (`DLC_FORKED_START=0` in the launcher's
    or the job's environment)."""
    value = (spec.env or {}).get(FORKED_START_ENV, os.environ.get(FORKED_START_ENV))
    return not layout.switched_off(value)


def node_agent_argv(spec: JobSpec, node: int | str, port: int | str, script: str, python: str,
                    exit_file: str, master_addr: str = "127.0.0.1") -> list[str]:
    """A node's agent as an engine starts it without a standby: torchrun's command line,
    behind `-m jupyter_dlc.node.standby --cold EXIT_FILE` where the forked start is wanted
    (the agent records its exit code in EXIT_FILE)."""
    argv = torchrun_argv(spec, node, port, script, python, master_addr)
    return cold_argv(argv, exit_file) if forked_start_wanted(spec) else argv


def agent_summary_codes(attempt_dir: str, nodes: int) -> dict[int, int]:
    """Exit codes of workers killed by a signal, from torchrun's failure summary in each
    node's log (every engine whose node logs reach the job directory reads them so)."""
    codes: dict[int, int] = {}
    for node in range(nodes):
        try:
            with open(layout.node_log(attempt_dir, node), "rb") as f:
                # The summary is what an agent prints last; this runs every tick.
                f.seek(max(0, os.fstat(f.fileno()).st_size - _SUMMARY_TAIL))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        for rank, code in _SUMMARY_BLOCK.findall(text):
            code = int(code)
            # torchrun reports death by signal N as -N; the shell convention is 128 + N.
            codes[int(rank)] = 128 - code if code < 0 else code
    return codes
