"""A full disk under the data dir: noticed, said plainly, and survived.

The launcher keeps a reserve file in the data dir. When the disk fills (ranks checkpointing
or logging there, or anything else), a write of the store fails; the reserve is then given
up so that what matters most still gets written: state changes, a failed attempt's verdict,
heartbeats. While the disk is full, metrics are not stored, submits are refused with a
one-line reason, and every job summary carries the condition for the views. Once space is
back, the reserve is taken again.
"""

from __future__ import annotations

import errno
import os
import sqlite3

RESERVE_BYTES = 4 << 20
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

    def take_reserve(self) -> bool:
        if os.path.exists(self.reserve):
            return True
        try:
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
            return True
        except OSError:
            try:
                os.unlink(self.reserve)
            except OSError:
                pass
            return False

    def on_full(self) -> None:
        """A write failed for want of space: give up the reserve for the writes that matter."""
        self.full = True
        try:
            os.unlink(self.reserve)
        except OSError:
            pass

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
