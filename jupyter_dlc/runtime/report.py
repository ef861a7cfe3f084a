"""Reports from this rank to the launcher: metrics, system samples, events, heartbeats.

The training thread only appends to bounded in-memory buffers; one daemon thread batches
them into `POST {DLC_LAUNCHER_URL}/api/jobs/{DLC_JOB_ID}/report` (ARCHITECTURE.md, "Rank
report protocol"). A batch leaves the buffer only once the launcher accepted it, so a
launcher that is down or restarting costs retries, never data (unless the buffer overflows,
which drops the oldest entries and counts them). Every report is a heartbeat; with nothing
to say the thread still reports every DLC_HEARTBEAT_INTERVAL seconds.

Where the node runs a reporter (jupyter_dlc/node/reporter.py, started beside the torchrun
agent by every engine, which names its URL file in $DLC_NODE_REPORTER), the POST goes to it
over loopback and it forwards the node's reports
as one batch; its answer is still the launcher's. Where none runs, or it stopped answering,
the report goes to the launcher directly (a plain torchrun run, an engine without one).

Heartbeats never wait on data: a batch the launcher refuses (4xx), one that cannot be
encoded, or one that keeps failing while a bare heartbeat gets through, is dropped with its
reason on stderr; and nothing a batch holds can end the thread.
"""

import atexit
import collections
import os
import sys
import threading
import time

from .. import identity, layout, wirejson
from . import breakdown, control, system
from ..report_client import (
    ENV as NODE_REPORTER_ENV,
    MAX_PACE,
    RETRYABLE_CLIENT_ERRORS,
    launcher_tls,
    paced,
    phase_shift,
    post_until,
)
from .env import rank_info

# Metrics reach live views within about this long after a log(); batching keeps a rank to a
# few POSTs a second however fast its loop logs. A small job can afford more (views draw
# within a quarter second end to end); past ~100 ranks the launcher's load sets the pace, so
# the interval grows with the world up to BATCH_INTERVAL (benchmarks/ingest.py, live_view.py).
BATCH_INTERVAL = 0.25
MIN_BATCH_INTERVAL = 0.1
RANKS_PER_SECOND_OF_INTERVAL = 400


def interval_override() -> float | None:
    """`$DLC_REPORT_INTERVAL` in seconds when it is a positive number, else None."""
    try:
        seconds = float(os.environ.get("DLC_REPORT_INTERVAL") or 0.0)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def batch_interval(world_size: int) -> float:
    """Seconds between a rank's data reports: `$DLC_REPORT_INTERVAL` when set, else by size."""
    override = interval_override()
    if override is not None:
        return override
    return min(BATCH_INTERVAL, max(MIN_BATCH_INTERVAL, world_size / RANKS_PER_SECOND_OF_INTERVAL))


# A rank whose process keeps a core busy (a CPU-bound loop; a GPU loop that spins in its
# syncs) pays for each report in its step time: the sender's work and the GIL it takes, and
# on a machine without an idle core the receiver's work too (benchmarks/telemetry.py: on
# two cores, a report every 0.1 s cost such a loop 0.3-3.5% from hour to hour, one a second
# nothing measurable). So its interval stretches from its own towards BUSY_BATCH_INTERVAL as its
# process's CPU share over the last BUSY_WINDOW goes from BUSY_FROM to BUSY_FULL of a core.
# A rank that waits (sleeps, reads input, blocks in a device sync or a collective) keeps its
# short interval: there a report costs the loop nothing, and the live views want it.
BUSY_BATCH_INTERVAL = 0.5
BUSY_FROM, BUSY_FULL = 0.5, 0.9
BUSY_WINDOW = 1.0


def stretched_interval(own: float, cpu_share: float, heartbeat: float) -> float:
    """The batch interval of a rank with interval `own` whose process used `cpu_share` of a
    core lately (above); never past its heartbeat interval, which the launcher judges it by."""
    most = min(BUSY_BATCH_INTERVAL, heartbeat)
    if cpu_share <= BUSY_FROM or own >= most:
        return own
    busy = min(1.0, (cpu_share - BUSY_FROM) / (BUSY_FULL - BUSY_FROM))
    return own + busy * (most - own)


# A streaming rank's report leaves with the first log() from RIPE of its interval on: the
# batches line up with the steps, and each batch's newest point waits nothing. A timer at a
# random phase to the steps kept every point waiting half an interval on average (at 20
# steps a second and 0.1 s, 50 ms against 25: the live view's logged -> stored,
# benchmarks/live_view.py). The timer stays, LATE of an interval later, for entries no log()
# comes after. Not while the launcher paces the rank: in synchronous training every rank
# logs at once, and the pace's phase shift spreads them.
RIPE, LATE = 0.9, 0.25

MAX_BATCH = 2000
HTTP_TIMEOUT = 3.0
MAX_BACKOFF = layout.REPORT_MAX_BACKOFF
EXIT_FLUSH_SECONDS = 5.0
# How long a rank that found no node reporter reports directly before it looks again.
NODE_REPORTER_RECHECK = 5.0
_RETRYABLE_CLIENT_ERRORS = RETRYABLE_CLIENT_ERRORS  # "later"; every other 4xx: never
# A batch that failed this many times while a bare heartbeat got through is what the
# launcher cannot take (a 500 on its content): dropped, so the job is not killed as silent.
POISON_TRIES = 3
DELIVERED, REFUSED, RETRY = "delivered", "refused", "retry"
_clock = time.perf_counter


class _BoundedBuffer:
    """A FIFO that drops its oldest entries when full, and counts what it dropped."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.items = collections.deque()
        self.dropped = 0

    def take(self, n):
        return [self.items.popleft() for _ in range(min(n, len(self.items)))]

    def trim(self):
        while len(self.items) > self.capacity:
            self.items.popleft()
            self.dropped += 1


class Reporter:
    """Thread-safe; the caller's cost per entry is one lock and one append."""

    def __init__(self, info, on_commands, capacity=20000, sample=None):
        self.url = f"{info.launcher_url}/api/jobs/{info.job_id}/report"
        self.token = info.token
        self._headers = {"Content-Type": "application/json", "Authorization": f"token {info.token}"}
        self._channels = {}  # url -> identity.Channel, used by the sender thread only
        self.key = info.proof_key or None  # None: a launcher that proves nothing (older)
        self.tls = launcher_tls()
        self.heartbeat_interval = info.heartbeat_interval
        self.own_interval = self.batch_interval = batch_interval(info.world_size)
        # The interval as this rank's load stretched it (stretched_interval), and the
        # launcher's pace (`report_interval`): the batch interval is the longer one. One
        # set with $DLC_REPORT_INTERVAL is kept as it is, busy or not.
        self._stretches = interval_override() is None
        self._stretched = self.own_interval
        self._pace = 0.0
        self._cpu_mark = (time.process_time(), time.monotonic())
        self._shift = 0.0  # once, after the launcher's pace grew (node_reporter.phase_shift)
        self.identity = {"rank": info.rank, "node": info.node_rank, "attempt": info.attempt,
                         "pid": os.getpid()}
        self.on_commands = on_commands
        self._node_file = os.environ.get(NODE_REPORTER_ENV) or None
        self._node_url = None
        self._node_recheck = 0.0
        self.reports_via_node = 0
        self.reports_sent = 0
        self._lock = threading.RLock()  # entered directly where log() waits: a C call, no frame
        self._cond = threading.Condition(self._lock)
        self._buffers = {"metrics": _BoundedBuffer(capacity),
                         "system": _BoundedBuffer(capacity // 10),
                         "events": _BoundedBuffer(capacity // 10)}
        self._metric_items = self._buffers["metrics"].items
        self._metric_limit = min(capacity + 1, MAX_BATCH)  # past it: trim, or send at once
        self._urgent = False
        self._ripe_at = float("inf")  # perf_counter: a log() from then on sends (RIPE)
        self._sending = False
        self._napping = False  # the sender waits for the next heartbeat, not a batch
        self._warned_drop = False
        self._warned_status = set()
        self._warned_impostor = set()
        self._failures = 0
        self._unsent = None  # the batch being sent, kept whole until it is done with
        self._batch_n = 0  # its number, this process's: one a batch, not one a try
        # The node's system sampler (system.py), opened and read on this thread as its wakes
        # come, at most once a heartbeat interval: a thread of its own would take the GIL from
        # the training thread at wakes of its own.
        self._open_sampler = sample
        self._thread = threading.Thread(target=self._run, name="dlc-reporter", daemon=True)
        self._thread.start()
        atexit.register(self.flush, EXIT_FLUSH_SECONDS)

    @property
    def dropped(self):
        with self._cond:
            return sum(b.dropped for b in self._buffers.values())

    def metric(self, step, values):
        self.record(_clock(), step, values, None)

    def record(self, at, step, values, ended):
        """A step's metrics, logged at perf_counter `at`, with the step breakdown `ended`
        (breakdown.end_step's, or None), in the fewest steps: log() calls it every step. The
        entry is made with the rest of its batch, on the sender's thread (_metric_entries)."""
        entry = (at, step, values, ended)
        with self._lock:
            items = self._metric_items
            items.append(entry)
            if at >= self._ripe_at:
                self._ripe_at = float("inf")
                self._urgent = True
                self._cond.notify_all()
            elif len(items) >= self._metric_limit or self._napping:
                self._after_put(self._buffers["metrics"], "metrics", False)

    def system(self, device, values):
        self._put("system", {"t": time.time(), "device": device, "values": values})

    def event(self, type_, **fields):
        """Events go out at once rather than with the next batch."""
        self._put("events", {"t": time.time(), "type": type_, **fields}, urgent=True)

    def flush(self, timeout):
        """Wait until everything buffered so far is accepted, at most timeout seconds.
        Returns True when the buffers drained."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            while self._pending() or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _put(self, kind, entry, urgent=False):
        with self._cond:
            buffer = self._buffers[kind]
            buffer.items.append(entry)
            self._after_put(buffer, kind, urgent)

    def _after_put(self, buffer, kind, urgent):
        """Under the lock, after an entry was appended: trim, warn, wake the sender."""
        buffer.trim()
        if buffer.dropped and not self._warned_drop:
            self._warned_drop = True
            print(f"jupyter_dlc: report buffer full, dropping the oldest {kind} entries "
                  "(is the launcher reachable?)", file=sys.stderr, flush=True)
        if urgent or len(buffer.items) >= MAX_BATCH:
            self._urgent = True
            self._cond.notify_all()
        elif self._napping:
            # The sender sleeps until the next heartbeat while nothing comes; wake it so
            # that this entry goes out within the batch interval, not a heartbeat later.
            # While entries stream in it looks again each batch interval by itself: a wake
            # is a GIL hand-over with this (the training) thread, so none per entry.
            self._napping = False
            self._cond.notify_all()

    def _pending(self):
        return self._unsent is not None or any(b.items for b in self._buffers.values())

    def _run(self):
        backoff = 0.0
        last_report = 0.0
        streaming = False  # the last report carried entries: more are likely within a batch
        sampler = None
        try:
            sampler = self._open_sampler() if self._open_sampler else None
        except Exception as error:  # noqa: BLE001 - heartbeats go on without system samples
            self._note(f"no system sampling: {error!r}")
        next_sample = time.monotonic() + self.heartbeat_interval
        while True:
            if sampler is not None and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + self.heartbeat_interval
                sampler = self._sample(sampler)  # outside the lock: log() never waits on it
            with self._cond:
                while True:
                    now = time.monotonic()
                    pending = self._pending()
                    batching = pending or streaming
                    wait = self.batch_interval
                    if self._ripe_at != float("inf"):
                        wait *= 1 + LATE  # a log() sends it before (RIPE)
                    due = last_report + self._shift + (wait if batching else self.heartbeat_interval)
                    if backoff:
                        due = max(due, last_report + backoff)
                    elif self._urgent:
                        due = now
                    if now >= due:
                        if pending or not batching or backoff or self._urgent:
                            break
                        streaming = False  # a batch interval without entries: wait for a heartbeat
                        continue
                    # While batching, a sample waits for the next batch's wake (within a batch
                    # interval); idle, it has a wake of its own.
                    wake = due if sampler is None or batching else min(due, next_sample)
                    if now >= wake:
                        break  # a sample first
                    self._napping = not batching
                    self._cond.wait(wake - now)
                self._napping = False
                if now < due:
                    continue
                self._urgent = False
                self._ripe_at = float("inf")
                taken_at = _clock()
                self._shift = 0.0
                taken = None
                if self._unsent is None:
                    # A batch is sent again as it was, under its number, until it is done
                    # with: the launcher stores a batch it already has once (a lost answer).
                    self._batch_n += 1
                    taken = {kind: b.take(MAX_BATCH) for kind, b in self._buffers.items()}
                self._sending = True  # (flush() waits on it while the entries are made)
            if taken is not None:
                try:
                    taken["metrics"] = _metric_entries(taken["metrics"], time.time() - _clock())
                except Exception as error:  # noqa: BLE001 - the thread that carries heartbeats must live
                    self._note(f"{len(taken['metrics'])} metric entries dropped: {error!r}")
                    taken["metrics"] = []
                self._unsent = taken
            batch = self._unsent
            try:
                delivered = self._deliver(batch)
            except Exception as error:  # noqa: BLE001 - the thread that carries heartbeats must live
                self._note(f"report dropped after an unexpected error: {error!r}")
                delivered = True
            last_report = time.monotonic()
            streaming = any(batch.values())
            if self._stretches:
                self._look_at_load(last_report)
            with self._cond:
                self._sending = False
                if delivered:
                    backoff = 0.0
                    self._unsent = None
                    if streaming and not self._pace:
                        # a slow answer still leaves half an interval before the next
                        interval = self.batch_interval
                        self._ripe_at = max(taken_at + RIPE * interval, _clock() + interval / 2)
                else:
                    backoff = min(MAX_BACKOFF, max(0.25, backoff * 2))
                self._cond.notify_all()

    def _look_at_load(self, now):
        """Stretch or shorten the batch interval by the process's CPU share since the last
        look, at most once a BUSY_WINDOW (one clock read a report otherwise)."""
        cpu_then, then = self._cpu_mark
        if now - then < BUSY_WINDOW:
            return
        cpu = time.process_time()
        self._cpu_mark = (cpu, now)
        self._stretched = stretched_interval(self.own_interval, (cpu - cpu_then) / (now - then),
                                             self.heartbeat_interval)
        self._set_interval()

    def _set_interval(self):
        """The batch interval from this rank's stretched one and the launcher's pace."""
        interval = max(self._stretched, self._pace)
        self._shift += phase_shift(self.batch_interval, interval)
        self.batch_interval = interval

    def _sample(self, sampler):
        """Put the node's devices' sample in the report; the sampler, or None once it failed."""
        try:
            for device, values in sampler.sample():
                self.system(device, values)
        except Exception as error:  # noqa: BLE001 - the thread that carries heartbeats must live
            self._note(f"system sampling stopped: {error!r}")
            return None
        return sampler

    def _deliver(self, batch):
        """True when the batch is done with: accepted, or dropped with a reason."""
        outcome = self._post(batch, self._batch_n)
        if outcome != RETRY:
            self._failures = 0
            return True
        if not any(batch.values()):
            return False
        # Is it the launcher, or this batch? A bare heartbeat tells, and keeps the job alive.
        if self._post({}) != DELIVERED:
            return False
        self._failures += 1
        if self._failures < POISON_TRIES:
            return False
        self._failures = 0
        self._note(f"a report batch failed {POISON_TRIES} times while heartbeats got through; "
                   f"dropped {sum(len(v) for v in batch.values())} entries")
        return True

    def _post(self, batch, n=None):
        """DELIVERED, REFUSED (4xx or not encodable: never retried) or RETRY. `n`: the batch's
        number (a bare heartbeat has none)."""
        body = {**self.identity, "t": time.time(), **({"n": n} if n is not None else {}), **batch}
        try:
            data = wirejson.dumps(body, default=_plain)
        except (TypeError, ValueError) as error:
            self._note(f"report dropped, it cannot be sent as JSON: {error}")
            return REFUSED
        node_url = self._node_reporter()
        if node_url:
            outcome = self._send(node_url + "/report", data, node=True)
            if outcome is not None:
                self.reports_via_node += outcome == DELIVERED
                return outcome
            # Nobody listens there (the node reporter ended), or it is stuck: report directly
            # for a while.
            self._node_url, self._node_recheck = None, time.monotonic() + NODE_REPORTER_RECHECK
        return self._send(self.url, data) or RETRY

    def _node_reporter(self):
        """The node reporter's URL, or None (looked up again every NODE_REPORTER_RECHECK)."""
        if self._node_url or not self._node_file or time.monotonic() < self._node_recheck:
            return self._node_url
        try:
            with open(self._node_file) as f:
                self._node_url = f.read().strip() or None
        except OSError:
            self._node_recheck = time.monotonic() + NODE_REPORTER_RECHECK
        return self._node_url

    def _send(self, url, data, node=False):
        """DELIVERED, REFUSED, RETRY, or None when nothing listens at `url`. A node reporter
        (`node`) answers well within HTTP_TIMEOUT whatever the launcher does (503 after its
        own FORWARD_TIMEOUT): one that does not is stuck (stopped, deadlocked), and counts as
        gone too, or its ranks' heartbeats would stall with it. An answer that does not prove
        the launcher (identity.py) is no answer: whatever took the port after the launcher
        (or the node reporter) died gets no say over this rank, and its batch is kept."""
        try:
            # A node reporter may hold the request up to MAX_PACE to keep the launcher's pace.
            timeout = HTTP_TIMEOUT + (MAX_PACE if node else 0.0)
            answer = self._channel(url).post(data, self._headers, self.key, timeout)
        except ConnectionRefusedError:
            return None
        except TimeoutError:
            return None if node else RETRY
        except (OSError, ValueError):
            # Connection reset, timeout, half-written answer: the launcher is down or
            # restarting; keep the batch and retry.
            return RETRY
        if not answer.proven:
            self._warn_impostor(url)
            return None if node else RETRY
        if answer.status >= 300:
            if answer.status < 500 and answer.status not in _RETRYABLE_CLIENT_ERRORS:
                self._warn_refused(answer)
                return REFUSED
            return RETRY
        try:
            reply = wirejson.loads(answer.body or b"{}")
        except ValueError:
            return RETRY
        self.reports_sent += 1
        if not node and isinstance(reply, dict):
            # The launcher's pace (launcher/pacing.py) when it asks for a slower one than ours;
            # through a node reporter, that process keeps it for the node.
            self._pace = paced(reply, MAX_PACE)
            self._set_interval()
        commands = reply.get("commands") if isinstance(reply, dict) else None
        if commands:
            self.on_commands(commands)
        return DELIVERED

    def _channel(self, url):
        """The kept connection to `url` (the launcher's report route, or the node reporter's)."""
        channel = self._channels.get(url)
        if channel is None:
            for stale in [u for u in self._channels if u != self.url]:  # a node reporter that moved
                self._channels.pop(stale).close()
            channel = self._channels[url] = identity.Channel(url, self.tls)
        return channel

    def _note(self, message):
        print(f"jupyter_dlc: {message}", file=sys.stderr, flush=True)

    def _warn_refused(self, answer):
        if answer.status not in self._warned_status:
            self._warned_status.add(answer.status)
            detail = answer.body[:300].decode(errors="replace").strip()
            self._note(f"launcher refused a report ({answer.status}), dropped: {detail}")

    def _warn_impostor(self, url):
        if url not in self._warned_impostor:
            self._warned_impostor.add(url)
            self._note(f"{url} is answered by something that cannot prove it is this job's "
                       "launcher; its answers are ignored and the reports kept until the "
                       "launcher answers again")


def _plain(value):
    """numpy and torch scalars in events (a step from a tensor) as plain numbers."""
    if hasattr(value, "item"):
        try:
            return value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _metric_entries(taken, offset):
    """Buffered (at, step, values, ended) as the report's entries: `offset` turns perf_counter
    into wall time; a value the script logged itself wins over the breakdown's."""
    with_values = breakdown.with_values
    return [{"t": at + offset, "step": step, "values": with_values(ended, values)}
            for at, step, values, ended in taken]


_NOT_STARTED = object()
_reporter = _NOT_STARTED
_reporter_lock = threading.Lock()


def send_events_now(events, timeout):
    """Deliver `events` (dicts with a "type") before this process leaves, within `timeout`
    seconds: through this process's Reporter when one runs (after what it still holds), else
    as a report of their own, retried while the launcher is unreachable. Used by the
    bootstrap for the records the launcher must not read from a shared filesystem (a rank's
    start, end and first error). Returns True when the launcher accepted them."""
    if queue_events_now(events):
        return _reporter.flush(timeout)
    stamped = [{"t": time.time(), **event} for event in events]
    info = rank_info()
    if not info.reporting:
        return False
    body = {"rank": info.rank, "node": info.node_rank, "attempt": info.attempt,
            "pid": os.getpid(), "t": time.time(), "events": stamped}
    data = wirejson.dumps(body, default=_plain)
    # An answer that does not prove the launcher counts as none (Reporter._send).
    status = post_until(f"{info.launcher_url}/api/jobs/{info.job_id}/report", data, info.token,
                        info.proof_key or None, launcher_tls(), time.monotonic() + timeout, HTTP_TIMEOUT)
    if status is not None and status >= 300:
        print(f"jupyter_dlc: launcher refused this rank's records ({status})", file=sys.stderr, flush=True)
    return status is not None and status < 300


def queue_events_now(events) -> bool:
    """Hand `events` to this process's running Reporter to send at once, without waiting for
    the answer; False where none runs (the caller then sends them itself)."""
    reporter = _reporter
    if not isinstance(reporter, Reporter):
        return False
    for event in events:
        reporter._put("events", {"t": time.time(), **event}, urgent=True)
    return True


_stacks_sent = False


def _on_commands(commands):
    """A launcher's commands: step-boundary requests go to `control`; a request for this
    rank's stacks (a suspected hang: the main thread may never reach a boundary again) is
    answered here, on the reporter's thread, once."""
    global _stacks_sent
    control.request_commands(commands)
    if control.STACKS in commands and not _stacks_sent and _reporter not in (None, _NOT_STARTED):
        _stacks_sent = True
        from . import stacks

        _reporter._put("events", stacks.snapshot(), urgent=True)


def get_reporter():
    """This process's Reporter, started on first use; None when no launcher is set."""
    global _reporter
    if _reporter is _NOT_STARTED:
        with _reporter_lock:
            if _reporter is _NOT_STARTED:
                info = rank_info()
                # One system sampler a node: on its LOCAL_RANK 0.
                sample = system.open_source if info.local_rank == 0 else None
                _reporter = Reporter(info, _on_commands, sample=sample) if info.reporting else None
    return _reporter
