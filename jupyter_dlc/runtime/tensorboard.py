"""TensorBoard event files for what `runtime.log()` records, when `tensorboard` is installed.

On by default where the package imports, as PyTorch Lightning's default logger is: people
who installed TensorBoard expect their curves in it without wiring a writer themselves.
`DLC_TENSORBOARD` (set it with `--env DLC_TENSORBOARD=...`) chooses:

    rank0 (default)  global rank 0 writes, like Lightning's rank-zero logging: one run per
                     attempt, not world-size runs that all show the same curve
    all              every rank writes its own run (to compare ranks, e.g. a straggler)
    off (or 0)       no event files

Files go to `<DLC_JOB_DIR>/tensorboard/attempt-<N>/rank-<R>/events.out.tfevents.*`, so
`tensorboard --logdir <data_dir>/jobs` shows every job beside each other, and an attempt
resumed from an earlier step gets a run of its own instead of overwriting steps it repeats.
Outside a launcher job (no DLC_JOB_DIR) nothing is written.

Writing never takes training down: a writer that cannot be made or written is reported
once on stderr and turned off.
"""

import atexit
import os
import sys
import threading

from .. import layout
from .env import rank_info

MODES = ("rank0", "all", "off")
# Events reach disk (and a running TensorBoard, which reloads every 5 s) within this long.
FLUSH_SECONDS = 2

_UNSET = object()
_writer = _UNSET
_lock = threading.Lock()


def requested_mode():
    """The mode DLC_TENSORBOARD asks for, and whether it was asked for explicitly."""
    raw = os.environ.get("DLC_TENSORBOARD", "").strip().lower()
    if not raw:
        return "rank0", False
    if raw in layout.OFF_WORDS:
        return "off", True
    if raw in ("1", "on", "true", "yes"):
        return "rank0", True
    if raw in MODES:
        return raw, True
    _warn(f"DLC_TENSORBOARD={raw!r} is not one of rank0, all, off; TensorBoard logging is off")
    return "off", True


def log_dir(info=None):
    """Where this rank writes, or None when it does not write."""
    info = info or rank_info()
    mode, _ = requested_mode()
    if not info.job_dir or mode == "off" or (mode == "rank0" and info.rank != 0):
        return None
    return os.path.join(info.job_dir, "tensorboard", f"attempt-{info.attempt}", f"rank-{info.rank}")


def wanted():
    """False once write() found that this rank writes nothing (then log() skips the call)."""
    return _writer is not None


def write(step, values):
    """Add one scalar per value at `step` (values are finite floats, as log() passes them)."""
    global _writer
    writer = _writer if _writer is not _UNSET else _open()
    if writer is None or not values:
        return
    try:
        for name, value in values.items():
            writer.add_scalar(name, value, global_step=step)
    except Exception as error:  # noqa: BLE001 - a full disk must not stop training
        _warn(f"TensorBoard writing failed ({error}); TensorBoard logging is off")
        _writer = None


def _open():
    global _writer
    with _lock:
        if _writer is not _UNSET:
            return _writer
        _writer = None
        path = log_dir()
        if path is None:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if requested_mode()[1]:
                _warn("DLC_TENSORBOARD is set but the tensorboard package is not installed "
                      "(pip install tensorboard); TensorBoard logging is off")
            return None
        try:
            _writer = SummaryWriter(log_dir=path, flush_secs=FLUSH_SECONDS)
        except Exception as error:  # noqa: BLE001 - e.g. a read-only job directory
            _warn(f"cannot write TensorBoard events to {path} ({error}); TensorBoard logging is off")
            return None
        # The bootstrap runs atexit handlers before os._exit, and a stop leaves through
        # SystemExit, so the last events are flushed however the rank ends cleanly.
        atexit.register(_writer.close)
        return _writer


def _warn(message):
    print(f"jupyter_dlc: {message}", file=sys.stderr, flush=True)
