"""Python's private APIs.

`atexit._run_exitfuncs`: the bootstrap leaves with `os._exit` (so a wedged non-daemon thread
cannot keep a rank alive) but must still run the atexit handlers (the runtime's last report,
the checkpoint commit, the user's hooks) first, under a time limit, in a thread of its own.
"""

from __future__ import annotations

import atexit


def run_exit_handlers() -> None:
    """Run (and clear) every atexit handler now, as interpreter shutdown would."""
    atexit._run_exitfuncs()
