"""The job's environment as it reaches nodes the launcher does not start itself: the lines of a
Slurm batch script, an SSH node's payload. Shared by the engines whose ranks run on other
hosts."""

from __future__ import annotations

import secrets

from .. import layout
from ..spec import network_env
from .contract import AttemptContext


def job_script_env(ctx: AttemptContext, profile) -> dict[str, str]:
    """The job's own variables (the env contract), as they go into the batch script; the
    launcher's ambient environment and the token travel through sbatch's environment."""
    net = network_env(ctx.spec.network, profile.get("interface"))
    mine = {k: v for k, v in ctx.env.items()
            if k.startswith(("DLC_", "EASYCKPT_")) or k in ctx.spec.env or k in net}
    mine.pop("DLC_TOKEN", None)
    mine.update(net)  # GLOO_SOCKET_IFNAME too, where an interface is named
    mine.update(ctx.spec.env)  # the user's --env wins, as with the local engine
    mine["PYTHONUNBUFFERED"] = "1"
    # Rank records (pid, exit, first error) come over the report route, not the job directory.
    mine[layout.RECORDS_ENV] = "report"
    # What node 0's preflight writes into the checkpoint directory and every node reads back.
    mine["DLC_PREFLIGHT_NONCE"] = secrets.token_hex(8)
    return mine
