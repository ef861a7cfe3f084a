"""`--dry-run`: the engine's native request for a job's first attempt, submitting nothing.

As `kubectl --dry-run=server` and TorchX's `submit_dryrun`: the launcher does everything a
submit does up to the engine's `submit` (the spec's checks, the cluster profile, the engine's
capacity check, the attempt's environment) and answers what the engine would be asked:
torchrun's command line per node, the sbatch script, the ssh command lines, the manifests.
Nothing is stored and nothing is left on disk.

What only a real start decides is not in it: the rendezvous port (chosen free at the start;
29500 here), the job token and the launcher's proof key (secrets, shown as placeholders), a
branch's planted step (planted at submit). The environment shown is what the launcher gives
the ranks beyond its own (the job's contract), not the launcher's whole environment.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from .. import identity
from ..engines.contract import get_engine
from ..spec import JobSpec
from .supervisor import Supervisor, create_job_dir, job_dir_path, new_job_id

PORT = 29500  # shown for the rendezvous port, which a real start picks free
TOKEN = "<job token: made at submit>"
PROOF = "<proof key: made at submit>"


def native_request(supervisor: Supervisor, data_dir: str, spec: JobSpec) -> dict[str, Any]:
    """{"engine", "job_id", "request"}: what `spec`'s engine would be asked for attempt 1,
    with the paths of the job directory it would have. The job's files are copied to a
    scratch directory (an engine may read them: Kubernetes puts them in a ConfigMap), which
    is removed before the answer."""
    job_id = new_job_id(spec.name)
    scratch_root = os.path.join(data_dir, "dry-runs")
    scratch = create_job_dir(scratch_root, job_id, spec)
    try:
        row = {"id": job_id, "name": spec.name, "spec": json.dumps(spec.to_dict()), "attempt": 1,
               "job_dir": scratch}
        ctx = supervisor.context(row, 1, reported=False)
        ctx.port = PORT
        proof = ctx.env.get(identity.KEY_ENV, "")
        ctx.env.update({"DLC_TOKEN": TOKEN, identity.KEY_ENV: PROOF})
        engine = get_engine(spec.engine)
        request = engine.dry_run(ctx).to_json()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    real = job_dir_path(data_dir, job_id)
    return {"engine": engine.name, "job_id": job_id,
            "request": _shown(request, {scratch: real, proof: PROOF} if proof else {scratch: real})}


def _shown(value: Any, replace: dict[str, str], key: str = "") -> Any:
    """The request as a user may read it: the scratch directory's paths as the job's, no
    secret, and of an `env` only what the launcher adds to its own environment."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if key != "env" or os.environ.get(k) != v]
        return {k: _shown(v, replace, k) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [_shown(item, replace) for item in value]
    if isinstance(value, str):
        for old, new in replace.items():
            value = value.replace(old, new)
    return value
