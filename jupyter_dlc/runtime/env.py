"""The facts a rank learns from its environment (torchrun's variables and the launcher's).

Read fresh on every call: it is cheap, and a script run by plain `python` (no torchrun, no
launcher) simply sees a world of one with reporting off.
"""

import json
import os
from dataclasses import dataclass

from ..identity import KEY_ENV


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    restart_count: int
    job_id: str
    job_name: str
    attempt: int
    nnodes: int
    launcher_url: str
    token: str
    proof_key: str      # checks the launcher's answers (jupyter_dlc/identity.py); "": none
    job_dir: str
    checkpoint_dir: str
    resume_path: str
    heartbeat_interval: float
    keep_last: int
    collective_timeout: float
    branch_from: str = ""      # PARENT_ID@STEP for a branch (`--from`); "": none
    fresh_optimizer: bool = False

    @property
    def branch_step(self):
        """The step a branch starts from, or None for a job that is no branch."""
        job, _, step = self.branch_from.rpartition("@")
        return int(step) if job and step.isdigit() else None

    @property
    def reporting(self):
        return bool(self.launcher_url and self.job_id)

    @property
    def managed(self):
        """Started by torchrun or by the launcher (so SIGTERM means "save and leave")."""
        return "TORCHELASTIC_RUN_ID" in os.environ or bool(self.job_id)


def _int(name, default):
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def _float(name, default):
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def rank_info():
    rank = _int("RANK", 0)
    return RankInfo(
        rank=rank,
        local_rank=_int("LOCAL_RANK", 0),
        world_size=_int("WORLD_SIZE", 1),
        local_world_size=_int("LOCAL_WORLD_SIZE", 1),
        node_rank=_int("DLC_NODE_RANK", _int("GROUP_RANK", 0)),
        restart_count=_int("TORCHELASTIC_RESTART_COUNT", 0),
        job_id=os.environ.get("DLC_JOB_ID", ""),
        job_name=os.environ.get("DLC_JOB_NAME", ""),
        attempt=_int("DLC_ATTEMPT", 1),
        nnodes=_int("DLC_NNODES", 1),
        launcher_url=os.environ.get("DLC_LAUNCHER_URL", "").rstrip("/"),
        token=os.environ.get("DLC_TOKEN", ""),
        proof_key=os.environ.get(KEY_ENV, ""),
        job_dir=os.environ.get("DLC_JOB_DIR", ""),
        checkpoint_dir=os.environ.get("DLC_CHECKPOINT_DIR", ""),
        resume_path=(os.environ.get("DLC_RESUME_PATH")
                     or os.environ.get("EASYCKPT_RESUME_PATH") or ""),
        heartbeat_interval=_float("DLC_HEARTBEAT_INTERVAL", 5.0),
        keep_last=_int("DLC_KEEP_LAST", 3),
        collective_timeout=_float("DLC_COLLECTIVE_TIMEOUT", 1800.0),
        branch_from=os.environ.get("DLC_BRANCH_FROM", ""),
        fresh_optimizer=os.environ.get("DLC_FRESH_OPTIMIZER", "") == "1",
    )


def params(**defaults):
    """A sweep trial's parameters over `defaults`: `runtime.params(lr=1e-3, batch=32)` gives
    the defaults when the script runs alone, and the trial's values (`%%dlc --sweep lr=...`,
    DLC_PARAMS) in a sweep; a name the trial sets beyond `defaults` is there too. The values
    keep the types the sweep gave them (numbers, booleans, strings)."""
    raw = os.environ.get("DLC_PARAMS", "")
    trial = json.loads(raw) if raw.strip() else {}
    return {**defaults, **trial}
