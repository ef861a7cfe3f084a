"""What the next step boundary must do: requests (SIGTERM, launcher commands), the
Checkpointer to save with, and whether training has gone non-finite.

Signals and commands arrive on other threads at any moment; they only set state here. The
training thread acts on it at a step boundary (see boundary.py), where saving is safe.
"""

import signal
import threading

from .env import rank_info

STOP = "stop"
CHECKPOINT = "checkpoint"
# Not a step-boundary request: the reporter thread answers it at once (runtime/stacks.py).
STACKS = "stacks"

# Reentrant: the SIGTERM handler runs on the main thread, possibly while it holds the lock.
_lock = threading.RLock()
_requests: dict[str, str] = {}  # kind -> reason, e.g. {"stop": "SIGTERM"}
_checkpointer = None
_non_finite = None  # the one-line reason, once a logged value was NaN/Inf
_handler_considered = False


def request(kind, reason):
    with _lock:
        _requests.setdefault(kind, reason)


def request_commands(commands):
    """Called with the `commands` of a launcher's answer to a report."""
    for command in commands:
        if command in (STOP, CHECKPOINT):
            request(command, f"{command} command from the launcher")


def pending():
    """Whether any request waits (without the lock: a dict's truth is one atomic read)."""
    return bool(_requests)


def requested():
    with _lock:
        return dict(_requests)


def clear(kinds):
    with _lock:
        for kind in kinds:
            _requests.pop(kind, None)


def register_checkpointer(checkpointer):
    """The last Checkpointer built is the one a stop saves with."""
    global _checkpointer
    _checkpointer = checkpointer


def checkpointer():
    return _checkpointer


def mark_non_finite(reason):
    global _non_finite
    _non_finite = reason


def non_finite():
    return _non_finite


def install_sigterm_handler():
    """SIGTERM: save and leave at the next step boundary.

    Only under torchrun or the launcher, where SIGTERM means preemption or a stop; only from
    the main thread, the only one Python lets install handlers. Repeats are the same request
    (the launcher signals the process group and the torchrun agent forwards it again), so
    they change nothing; torchrun's SIGKILL after its grace period still ends a rank that
    never reaches another boundary.
    """
    global _handler_considered
    if _handler_considered or threading.current_thread() is not threading.main_thread():
        return
    _handler_considered = True
    if rank_info().managed:
        signal.signal(signal.SIGTERM, _on_sigterm)


def handler_considered():
    return _handler_considered


def _on_sigterm(signum, frame):
    request(STOP, "SIGTERM")
