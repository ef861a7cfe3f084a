"""What the launcher says of a job's checkpoint steps, for the checkpoints route, the resume
action and the supervisor's choice of a resume path alike.

A step is committed when its manifest verifies by size (layout.py); its files' sha256 are
checked where they are restored, by each rank for its own file (runtime/checkpoint.py), which
reports a `checkpoint_corrupt` event for a file that does not match and fails. So a step reads
`corrupt` once a rank reported one of its files (for the manifest it reported on: a step
written again is judged afresh), `verified` once an attempt restored it and every rank went
past it (each rank checked its file first), and `unverified` otherwise: sizes match, the
sha256 were computed as the files were written and nobody read them since. The launcher does
not hash the files itself: a step holds every rank's state (gigabytes each), the ranks hash
their own in parallel, and the launcher may not even see the directory (Kubernetes without
`launcher_pvc_dir`).
"""

from __future__ import annotations

import os

from .. import layout


def corrupt_reports(store, job_id: str, attempt: int | None = None) -> list[dict]:
    """The `checkpoint_corrupt` events of a job (or of one attempt): their data, with attempt."""
    return [dict(event["data"] or {}, attempt=event["attempt"])
            for event in store.events(job_id, types=(layout.CHECKPOINT_CORRUPT,))
            if attempt is None or event["attempt"] == attempt]


def listing(store, job_id: str, ckpt_dir: str) -> list[dict]:
    """Every committed step in `ckpt_dir`, oldest first: layout's record plus `verification`
    ("verified" | "unverified" | "corrupt") and `corrupt` ([{"file", "rank", "why",
    "attempt"}] of the files ranks found not matching)."""
    records = layout.committed_steps(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    if not records:
        return []
    reports = corrupt_reports(store, job_id)
    attempts = store.attempt_rows(job_id)
    out = []
    for record in records:
        bad = [{"file": r.get("file"), "rank": r.get("rank"), "why": r.get("why"),
                "attempt": r["attempt"]}
               for r in reports if r.get("step") == record["step"]
               and r.get("manifest_time") == record["time"]]
        if bad:
            verification = "corrupt"
        elif _restored_by_every_rank(store, job_id, attempts, record):
            verification = "verified"
        else:
            verification = "unverified"
        out.append(dict(record, verification=verification, corrupt=bad))
    return out


def resumable(steps: list[dict]) -> list[dict]:
    """The steps of `listing` a restart or resume may take: all but those found corrupt."""
    return [step for step in steps if step["verification"] != "corrupt"]


def _restored_by_every_rank(store, job_id: str, attempts, record: dict) -> bool:
    """Whether an attempt resumed from this very step (started after its manifest was
    written) and each of its ranks logged a later step: each checked its file to get there."""
    for attempt in attempts:
        if attempt["resume_path"] != record["path"] or (attempt["started"] or 0) < (record["time"] or 0):
            continue
        ranks = store.rank_rows(job_id, attempt["attempt"])
        if ranks and all(r["last_step"] is not None and r["last_step"] > record["step"] for r in ranks):
            return True
    return False
