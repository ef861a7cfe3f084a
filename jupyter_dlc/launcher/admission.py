"""Admission: which QUEUED jobs may start now. In submission order, while their ranks fit in
the process slots of this machine that jobs already past QUEUED leave free (the slots of an
engine whose ranks run here, `Engine.ranks_here`; an engine that runs them elsewhere queues
them itself), and within a sweep's `parallel`. No job overtakes another.
"""

from __future__ import annotations

import json
from collections import Counter

from ..engines.contract import (
    get_engine,
)
from ..hostprocs import process_slots
from ..spec import spec_engine
from .store import Store

def _sweep_of(row) -> dict | None:
    """The sweep a job is a trial of ({"id", "trial", "parallel"}), or None."""
    return json.loads(row["spec"]).get("sweep")


def _local_slots(row) -> int:
    """The process slots of this machine a job takes: none where its engine runs the ranks
    elsewhere (`Engine.ranks_here`)."""
    spec = json.loads(row["spec"])
    try:
        here = get_engine(spec_engine(spec)).ranks_here
    except ValueError:  # an engine no longer installed: it runs nothing here
        return 0
    return int(spec.get("nodes") or 1) * int(spec.get("nproc_per_node") or 1) if here else 0



class Admission:
    """The supervisor's admission: `slots` ranks may run on this machine at once (fixed at
    start: free memory falls as jobs run)."""

    def __init__(self, store: Store, slots: int | None = None):
        self.store = store
        self.slots = process_slots()[0] if slots is None else slots

    def admit(self, rows) -> set[str]:
        """The QUEUED jobs that may start now: in submission order, while their ranks fit in
        the slots that jobs already past QUEUED leave free. The first that does not fit waits,
        and so does everything queued after it (no job overtakes another)."""
        used = sum(_local_slots(r) for r in rows if r["state"] != "QUEUED")
        # A sweep's trials past QUEUED, against its `parallel`: a trial that must wait for its
        # own sweep holds up no other job (it is not blocked by slots, only by its sweep).
        sweeps = Counter(sweep["id"] for r in rows if r["state"] != "QUEUED" and (sweep := _sweep_of(r)))
        admitted: set[str] = set()
        blocked = False
        for row in rows:  # ordered by submission
            if row["state"] != "QUEUED" or row["stop_requested"]:
                if row["state"] == "QUEUED":
                    admitted.add(row["id"])  # a stopped job only has to end
                continue
            sweep = _sweep_of(row)
            if sweep and sweep["parallel"] is not None and sweeps[sweep["id"]] >= sweep["parallel"]:
                reason = (f"waiting: sweep {sweep['id']} runs {sweep['parallel']} "
                          f"trial{'s' if sweep['parallel'] != 1 else ''} at a time")
                if row["reason"] != reason:
                    self.store.update_job(row["id"], reason=reason)
                continue
            need = _local_slots(row)
            if need == 0:  # its engine queues it (Slurm's own queue), not this machine
                admitted.add(row["id"])
                sweeps.update([sweep["id"]] if sweep else [])
                continue
            if not blocked and used + need <= self.slots:
                admitted.add(row["id"])
                used += need
                sweeps.update([sweep["id"]] if sweep else [])
                continue
            blocked = True
            reason = (f"waiting for {need} process slot{'s' if need != 1 else ''} "
                      f"({used} of {self.slots} in use)")
            if row["reason"] != reason:
                self.store.update_job(row["id"], reason=reason)
        return admitted
