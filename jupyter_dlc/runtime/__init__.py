"""jupyter_dlc.runtime: what a training script imports inside its ranks.

    from jupyter_dlc import runtime
    runtime.init()                                   # or your own init_process_group
    sampler = runtime.ResumableDistributedSampler(dataset, shuffle=True, seed=0)
    ckpt = runtime.Checkpointer(model=model, optimizer=opt, sampler=sampler)
    step = ckpt.restore()                            # 0, or the step to continue after
    ...  for each optimizer step:  step += 1; runtime.log(step, loss=loss.item())
         every so often:           ckpt.save(step)

Each log() also logs where the step's time went (step_ms, data_wait_ms, grad_sync_ms,
ckpt_stall_ms: breakdown.py); `with runtime.timer("data"):` times a loader that is not torch's.

Works the same under plain `python` or `torchrun`: without DLC_LAUNCHER_URL, reporting is
off and everything else still works.
"""

from .breakdown import timer
from .boundary import NonFiniteLossError, log, should_stop
from .checkpoint import Checkpointer
from .dist_init import init
from .env import RankInfo, params, rank_info
from .report import EXIT_FLUSH_SECONDS, get_reporter
from .sampler import ResumableDistributedSampler
from . import control


def shutdown(timeout=EXIT_FLUSH_SECONDS):
    """Finish the checkpoint in flight and deliver buffered reports. atexit does this on a
    normal exit; call it yourself before os._exit (which skips atexit)."""
    checkpointer = control.checkpointer()
    if checkpointer is not None:
        checkpointer.wait()
    reporter = get_reporter()
    if reporter:
        reporter.flush(timeout)


__all__ = ["init", "log", "timer", "should_stop", "shutdown", "rank_info", "RankInfo", "params", "Checkpointer",
           "ResumableDistributedSampler", "NonFiniteLossError"]
