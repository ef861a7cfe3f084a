"""A full disk under the data dir: noticed, said plainly, and survived.

The launcher keeps a reserve file in the data dir. When the disk fills (ranks checkpointing
or logging there, or anything else), a write of the store fails; the reserve is then given
up so that what matters most still gets written: state changes, a failed attempt's verdict,
heartbeats. While the disk is full, metrics are not stored, submits are refused with a
one-line reason, no attempt starts, and every job summary carries the condition for the
views. Once space is back, the reserve is taken again.

When the disk stays full (what the reserve freed got eaten too), the store cannot write at
all, and a job can no longer be supervised: it is ended (launcher/supervisor.py) with the
condition as its reason, written with a last, smaller reserve kept for exactly that.
"""

from __future__ import annotations

import errno
import os
import sqlite3

RESERVE_BYTES = 4 << 20
# The last reserve: given up only for the verdicts that end jobs once the first is spent.
LAST_RESERVE_BYTES = 1 << 20
# Below this much free space the disk counts as full even before a write failed.
LOW_WATER = 1 << 20


def is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, sqlite3.OperationalError) and "disk is full" in str(error)


class DiskGuard:
    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.reserve = os.path.join(data_dir, "launcher.reserve")
        self.last_reserve = os.path.join(data_dir, "launcher.reserve.last")
        self.full = False
        self.take_reserve()
        self.check()

    @property
    def message(self) -> str | None:
        return (f"no space left in {self.data_dir}: metrics are not stored and submits are "
                "refused until space is freed") if self.full else None

    def free(self) -> int:
        stat = os.statvfs(self.data_dir)
        return stat.f_bavail * stat.f_frsize

    def reason(self, what: str) -> str:
        """A job's reason when the disk ends it: the condition, then `what` was not done."""
        return f"disk full: no space left in {self.data_dir}; {what}"

    def take_reserve(self) -> bool:
        # The last reserve first: it is the one that must be there when all else is spent.
        return _take(self.last_reserve, LAST_RESERVE_BYTES) and _take(self.reserve, RESERVE_BYTES)

    def on_full(self) -> bool:
        """A write failed for want of space: give up the reserve for the writes that matter.
        Returns whether that freed anything (False: the reserve was spent already)."""
        self.full = True
        return _give_up(self.reserve)

    def last_resort(self) -> bool:
        """The first reserve is spent and a verdict still cannot be written: give up the last
        one for it. Returns whether that freed anything."""
        self.full = True
        return _give_up(self.last_reserve)

    def check(self) -> None:
        """Each supervisor tick: notice a filling disk, and space coming back."""
        try:
            free = self.free()
        except OSError:
            return
        if free < LOW_WATER:
            self.on_full()
        elif os.path.exists(self.reserve):
            # Held, by this process or the other one: room again once as much is free as
            # taking it back leaves.
            if free > RESERVE_BYTES + LOW_WATER:
                self.full = False
        elif free > 2 * RESERVE_BYTES + LOW_WATER and self.take_reserve():
            self.full = False
        else:
            # The launcher and its ingest worker share the reserve: the one whose write failed
            # first gave it up, which freed enough that the other's free space looks fine.
            self.full = True


def _take(path: str, size: int) -> bool:
    if os.path.exists(path):
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        return True
    except OSError:
        _give_up(path)
        return False


def _give_up(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
