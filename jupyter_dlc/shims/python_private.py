"""Python's private APIs.

`atexit._run_exitfuncs`: the bootstrap leaves with `os._exit` (so a wedged non-daemon thread
cannot keep a rank alive) but must still run the atexit handlers (the runtime's last report,
the checkpoint commit, the user's hooks) first, under a time limit, in a thread of its own.

`sys._current_frames`: a rank that the launcher suspects of a hang is asked for its stacks
(runtime/stacks.py); its main thread is stuck, so another thread reads them.
"""

from __future__ import annotations

import atexit
import sys
from types import FrameType


def run_exit_handlers() -> None:
    """Run (and clear) every atexit handler now, as interpreter shutdown would."""
    atexit._run_exitfuncs()


def current_frames() -> dict[int, FrameType]:
    """Thread id -> that thread's current frame, for every thread of this interpreter."""
    return sys._current_frames()
