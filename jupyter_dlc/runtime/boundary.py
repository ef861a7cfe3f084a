"""The step boundary: `log()` and `should_stop()`, where the runtime may act.

Convention: `step` is the number of optimizer steps completed, so a checkpoint saved at a
boundary is "after step N" and a resumed run continues with step N + 1. Every rank should
call log() (or should_stop()) once per step: that is where a stop or checkpoint request is
acted on, at the same step on every rank (agreement.py).
"""

import math
import numbers
import operator
import time

from . import breakdown, control, dist_init, tensorboard
from .agreement import StepAgreement
from .dist_init import job_store
from .env import rank_info
from .report import EXIT_FLUSH_SECONDS, get_reporter

NAN_FLUSH_SECONDS = 2.0
_clock = time.perf_counter


class NonFiniteLossError(RuntimeError):
    """A logged value was NaN or infinite; the message says which and at what step."""


_last_step = 0
_agreement = None
# A full should_stop() ran with the SIGTERM handler installed and the group settled (so
# whether ranks must agree is known): from then on log() calls it only when one is pending.
_settled = False


def log(step, **metrics):
    """Record this step's metrics (numbers, numpy or one-element torch scalars) and act on
    pending requests. Cheap: reporting happens on a thread.

    Raises TypeError for a step that is not a whole number or a value that is not a number
    (here, where the mistake is, rather than in the reporter thread later), NonFiniteLossError
    on a NaN/Inf value (after reporting a "nan" event), and SystemExit(0) when the job was told
    to stop (after checkpointing).

    Every line here runs once a step between the script's own work, whose data has pushed
    this code's out of the CPU caches: a call or lookup that costs 0.1 us in a tight loop
    costs about 1 us here (benchmarks/telemetry.py), so the common case takes the fewest.
    """
    global _last_step
    now = _clock()
    ended = breakdown.end_step(now)  # first: the step ends when log() is called
    if type(step) is not int:
        step = as_step(step)
    _last_step = step
    values, non_finite = metrics, None  # the call's own dict, kept when every value is a finite float
    for value in metrics.values():
        if type(value) is not float or value - value != 0.0:  # (inf - inf and nan - nan are nan)
            values, non_finite = _numbers(metrics)
            break
    reporter = _reporter if _reporter is not None else _find_reporter()
    if reporter and (values or ended):
        reporter.record(now, step, values, ended)
    if tensorboard.wanted():
        tensorboard.write(step, breakdown.with_values(ended, values))
    if non_finite:
        _stop_non_finite(step, *non_finite, reporter)
    if _settled and not control.pending() and (_agreement is None or _agreement.idle()):
        return  # nothing for a boundary to do: no request here, none open among the ranks
    should_stop(step)


_reporter = None


def _find_reporter():
    """The process's Reporter (False when none: looked up once)."""
    global _reporter
    _reporter = get_reporter() or False
    return _reporter


def _numbers(metrics):
    """The finite values as floats, and the first non-finite one as (name, value), or None."""
    values, non_finite = {}, None
    for name, value in metrics.items():
        number = as_number(name, value)
        if math.isfinite(number):
            values[name] = number
        elif non_finite is None:
            non_finite = (name, number)
    return values, non_finite


def as_step(step):
    """A step as a plain int: ints, numpy integers and one-element integer tensors."""
    if isinstance(step, (bool, str, bytes)):
        raise TypeError(f"runtime.log: step must be a whole number, got {step!r}")
    try:
        return int(operator.index(step))  # numpy integers and integer tensors have __index__
    except TypeError:
        raise TypeError(f"runtime.log: step must be a whole number (int, numpy integer or "
                        f"one-element integer tensor), got {type(step).__name__} {step!r:.60}") from None


def as_number(name, value):
    """A metric value as a float: numbers, numpy scalars and one-element tensors."""
    kind = type(value)
    if kind is float or kind is int:  # the common case, before the ABC check (a few us a step)
        return float(value)
    if isinstance(value, (str, bytes, bool)):
        pass
    elif isinstance(value, numbers.Real):
        return float(value)
    elif hasattr(value, "item") and (getattr(value, "ndim", None) == 0 or _one_element(value)):
        number = value.item()  # a CUDA tensor syncs here: log .item()s you have anyway
        if isinstance(number, numbers.Real) and not isinstance(number, bool):
            return float(number)
    raise TypeError(f"runtime.log: {name}= must be a number (float, int, numpy scalar or "
                    f"one-element tensor), got {type(value).__name__} {value!r:.60}")


def _one_element(value):
    numel = getattr(value, "numel", None)
    try:
        return callable(numel) and numel() == 1 and hasattr(value, "item")
    except TypeError:
        return False


def should_stop(step=None, exit=True):
    """Act on pending requests at this step boundary (log() calls this for you).

    Returns False while training should go on. When every rank agreed to stop here, saves
    with the registered Checkpointer, waits for the commit, reports "preempted" and raises
    SystemExit(0); with exit=False it returns True instead, for callers that leave their
    loop themselves.
    """
    global _settled
    step = _last_step if step is None else step
    control.install_sigterm_handler()
    requests = control.requested()
    kinds = _agreed_kinds(step, set(requests))
    _settled = _settled or (control.handler_considered() and dist_init.group_settled())
    if not kinds:
        return False
    control.clear(kinds)
    checkpointer = control.checkpointer()
    if checkpointer is not None:
        checkpointer.save(step)
    if control.STOP not in kinds:
        return False
    committed = checkpointer.wait() if checkpointer is not None else False
    reporter = get_reporter()
    if reporter:
        # What was saved, said as it is: the launcher's stop reason repeats it.
        reporter.event("preempted", step=step, checkpointer=checkpointer is not None,
                       checkpoint=committed,
                       reason=requests.get(control.STOP, "stop requested on another rank"))
        reporter.flush(EXIT_FLUSH_SECONDS)
    if exit:
        raise SystemExit(0)
    return True


def _agreed_kinds(step, local_kinds):
    global _agreement
    store = job_store()
    if store is None:
        return local_kinds  # a world of one has nobody to agree with
    if _agreement is None:
        info = rank_info()
        _agreement = StepAgreement(store, info.world_size,
                                   f"dlc/{info.restart_count}-{info.attempt}")
    return _agreement.poll(step, local_kinds)


def _stop_non_finite(step, name, value, reporter):
    reason = f"{name} is {value} at step {step}; stopped, last good checkpoint kept"
    control.mark_non_finite(reason)
    if reporter:
        reporter.event("nan", step=step, name=name)
        reporter.flush(NAN_FLUSH_SECONDS)
    raise NonFiniteLossError(reason)
