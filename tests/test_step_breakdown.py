"""The step broken down on every rank (runtime/breakdown.py): one real 2x2 torchrun job (gloo
on CPU) under the real launcher, its phases told apart by step, read back through the
launcher's metrics route and its alert rules as any metric is.

- DDP, wrapped by the script after `runtime.init()`: a model whose gradient all-reduce
  dominates the step, and the same all-reduce (the same bytes, the same division) timed by
  hand beside it each step; their medians over every rank's steps agree within 20%.
- A DataLoader whose loading sleeps, compute ~30 ms (a sleep, so that a loaded machine
  cannot make it slower): 20 ms a batch in the loop (num_workers=0), 50 ms a batch in one
  worker process (num_workers=1, which prefetches while the loop computes, so the loop waits
  the other 20 ms). Both: data wait ~20 ms, step ~50 ms (medians).
- Steps where the script logs `data_wait_ms` and `step_ms` itself: its values are stored.
- Steps that save with the Checkpointer and wait for the commit: `ckpt_stall_ms` is the time
  the script measured around those calls.
"""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import wait_for
from test_ingest import all_points

SYNC_STEPS, DATA_STEPS, OWN_STEPS, SAVE_STEPS = 40, 20, 3, 2
FIRST_DATA0 = SYNC_STEPS + 1
FIRST_DATA1 = FIRST_DATA0 + DATA_STEPS
FIRST_OWN = FIRST_DATA1 + DATA_STEPS
FIRST_SAVE = FIRST_OWN + OWN_STEPS
LAST = FIRST_SAVE + SAVE_STEPS - 1

SCRIPT = f"""
import time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from jupyter_dlc import runtime

info = runtime.init()
torch.set_num_threads(1)
step = 0
runtime.log(step)  # the first boundary: steps are measured from here

# DDP, wrapped here by the script: a 4 MB gradient, so the all-reduce dominates the step.
model = DDP(torch.nn.Linear(1024, 1024))
torch.manual_seed(info.rank)  # each rank its own input: DDP's mean is not any rank's own
x = torch.randn(1, 1024)
for _ in range({SYNC_STEPS}):
    # Each all-reduce after the same lead: a barrier, then forward and backward, so that
    # the ranks come to both as far apart (a loaded machine spreads them).
    dist.barrier()
    model.zero_grad()
    model(x).sum().backward()  # DDP reduces: the mean over the ranks
    synced = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.barrier()
    model.zero_grad()
    with model.no_sync():
        model(x).sum().backward()  # this rank's own gradient
    hand = torch.cat([p.grad.flatten() for p in model.parameters()])
    started = time.perf_counter()
    hand.div_(info.world_size)  # what DDP's reduction does: the mean
    dist.all_reduce(hand)
    hand_ms = (time.perf_counter() - started) * 1e3
    step += 1
    runtime.log(step, hand_sync_ms=hand_ms, grad_error=(hand - synced).abs().max().item())


class Slow(torch.utils.data.Dataset):
    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return i


for workers, load in ((0, 0.02), (1, 0.05)):
    loader = torch.utils.data.DataLoader(Slow(load), batch_size=1, num_workers=workers)
    for _, batch in zip(range({DATA_STEPS}), loader):
        time.sleep(0.03)  # compute
        step += 1
        runtime.log(step)

for _ in range({OWN_STEPS}):
    step += 1
    runtime.log(step, data_wait_ms=31.0, step_ms=82.0)

ckpt = runtime.Checkpointer(model=model)
for _ in range(2):  # the second save waits for the first's persist: both are the loop's stall
    started = time.perf_counter()
    ckpt.save(step)
    ckpt.wait()
    stall_ms = (time.perf_counter() - started) * 1e3
    step += 1
    runtime.log(step, hand_stall_ms=stall_ms)
"""


@pytest.fixture(scope="module")
def job(shared_launcher):
    launcher = shared_launcher
    script = launcher.script("breakdown.py", SCRIPT)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2,
                                  "name": "breakdown", "max_restarts": 0,
                                  "alerts": ["data_wait_ms > 10"]})
    ended = launcher.client.wait(job["id"], timeout=240)
    assert ended["state"] == "SUCCEEDED", (ended, launcher.client.logs(job["id"], tail=40))
    points = wait_for(lambda: (lambda p: p if sum(x["step"] == LAST
                                                  for x in p) else None)(
        all_points(launcher.client, job["id"])), 30, what="the job's last points")
    return launcher, ended, points


def _values(points, name, first, count, rank=None):
    return [p["value"] for p in points if p["name"] == name and first <= p["step"] < first + count
            and (rank is None or p["rank"] == rank)]


def test_every_rank_logs_the_breakdown_of_every_step_but_the_first(job):
    _, _, points = job
    for name in ("step_ms", "data_wait_ms", "grad_sync_ms", "ckpt_stall_ms"):
        for rank in range(4):
            steps = sorted(p["step"] for p in points if p["name"] == name and p["rank"] == rank)
            assert steps == list(range(1, LAST + 1)), (name, rank, steps)
    assert not [p for p in points if p["step"] == 0 and p["name"] == "step_ms"]


def test_grad_sync_is_the_allreduce_timed_by_hand(job):
    _, _, points = job
    measured = statistics.median(_values(points, "grad_sync_ms", 2, SYNC_STEPS - 1))
    by_hand = statistics.median(_values(points, "hand_sync_ms", 2, SYNC_STEPS - 1))
    assert by_hand > 2.0, by_hand  # an all-reduce that takes time, or the test proves nothing
    assert abs(measured - by_hand) <= 0.2 * by_hand, (measured, by_hand)
    # DDP's gradients through the timing hook are the mean over the ranks.
    assert max(_values(points, "grad_error", 1, SYNC_STEPS)) < 1e-5
    # The data phases run no collective.
    assert max(_values(points, "grad_sync_ms", FIRST_DATA0, 2 * DATA_STEPS)) == 0.0


@pytest.mark.parametrize("first", [FIRST_DATA0, FIRST_DATA1], ids=["num_workers=0", "num_workers=1"])
def test_data_wait_and_step_time_of_a_slow_loader(job, first):
    _, _, points = job
    # Each phase's first step includes the iterator's start (a worker process forks).
    data = statistics.median(_values(points, "data_wait_ms", first + 1, DATA_STEPS - 1))
    step = statistics.median(_values(points, "step_ms", first + 1, DATA_STEPS - 1))
    assert 15.0 <= data <= 32.0, data
    assert 45.0 <= step <= 75.0, step
    assert max(_values(points, "ckpt_stall_ms", first, DATA_STEPS)) == 0.0


def test_a_value_the_script_logs_itself_wins(job):
    _, _, points = job
    assert set(_values(points, "data_wait_ms", FIRST_OWN, OWN_STEPS)) == {31.0}
    assert set(_values(points, "step_ms", FIRST_OWN, OWN_STEPS)) == {82.0}
    assert len(_values(points, "grad_sync_ms", FIRST_OWN, OWN_STEPS)) == 4 * OWN_STEPS


def test_an_alert_rule_names_a_breakdown_metric(job):
    launcher, ended, _ = job
    fired = wait_for(lambda: [e for e in launcher.client.events(ended["id"]) if e["type"] == "alert"],
                     30, what="the data_wait_ms alert")
    assert fired and fired[0]["data"]["condition"] == "data_wait_ms > 10", fired




def test_checkpoint_stall_is_the_time_in_save_and_wait(job):
    _, _, points = job
    for rank in range(4):
        stalls = _values(points, "ckpt_stall_ms", FIRST_SAVE, SAVE_STEPS, rank)
        by_hand = _values(points, "hand_stall_ms", FIRST_SAVE, SAVE_STEPS, rank)
        assert len(stalls) == len(by_hand) == SAVE_STEPS
        for stall, hand in zip(stalls, by_hand, strict=True):
            assert 0.9 * hand <= stall <= hand, (rank, stalls, by_hand)
    assert max(_values(points, "ckpt_stall_ms", 1, FIRST_SAVE - 1)) == 0.0


def test_the_view_draws_where_each_step_goes(job):
    """The notebook view's stacked chart: per step the median over ranks of each part, or one
    rank's own parts once that rank is chosen; in the document the widget sends."""
    from jupyter_dlc.widgets import JobView

    launcher, ended, points = job
    view = JobView(launcher.client, ended["id"], ended_interval=0.5)
    view.start()
    assert view.join(timeout=60), "the view's thread still runs after the job ended"
    source = view.charts.steps_source
    assert list(source.data["x"]) == list(range(1, LAST + 1))
    assert view.charts.steps_fig.visible and view.steps_select.layout.display == ""
    assert [label for label, _ in view.steps_select.options] == \
        ["median of the ranks", "rank 0", "rank 1", "rank 2", "rank 3"]

    def parts(step, rank=None):
        def one(name):
            values = _values(points, name, step, 1, rank)
            return statistics.median(values) if values else 0.0
        per_rank = [p["value"] - sum(_values(points, n, step, 1, p["rank"])[0]
                                     for n in ("data_wait_ms", "grad_sync_ms", "ckpt_stall_ms"))
                    for p in points if p["name"] == "step_ms" and p["step"] == step
                    and (rank is None or p["rank"] == rank)]
        return [one("data_wait_ms"), one("grad_sync_ms"), one("ckpt_stall_ms"),
                max(0.0, statistics.median(per_rank))]

    def drawn(step):
        i = list(source.data["x"]).index(step)
        return [source.data[k][i] for k in ("data", "sync", "ckpt", "compute")]

    for step in (3, FIRST_DATA0 + 5, FIRST_DATA1 + 5, FIRST_SAVE):
        assert drawn(step) == pytest.approx(parts(step)), step
    assert drawn(FIRST_DATA0 + 5)[0] > 10 and drawn(3)[1] > 2  # the parts the phases have
    view.steps_select.value = 2
    assert view.charts.steps_fig.title.text == "where each step goes (rank 2)"
    for step in (3, FIRST_DATA1 + 5):
        assert drawn(step) == pytest.approx(parts(step, 2)), step
    view.bokeh.update_from_model(view.charts.layout)
    bundle = json.dumps(view.bokeh.render_bundle, default=str)
    assert '"dlc-step-breakdown"' in bundle and '"dlc-steps"' in bundle


# -- in this process, no job ----------------------------------------------------------------

class _FakeEvent:
    """A CUDA event stand-in: `passed` says whether the device got past it."""

    def __init__(self, at):
        self.at, self.passed = at, False

    def query(self):
        return self.passed

    def elapsed_time(self, end):
        assert self.passed and end.passed, "elapsed_time before the device passed both events"
        return end.at - self.at


class _Bucket:
    def __init__(self, last, cuda=True):
        self.last, self.cuda = last, cuda

    def is_last(self):
        return self.last

    def buffer(self):
        return type("Buffer", (), {"is_cuda": self.cuda})()


def test_cuda_timed_sync_is_read_once_the_device_passed_it_without_a_synchronise(monkeypatch):
    import torch

    from jupyter_dlc.runtime import breakdown

    monkeypatch.setattr(breakdown, "_installed", True)  # no shims in this process
    monkeypatch.setattr(breakdown, "_last_boundary", None)
    monkeypatch.setattr(breakdown, "_cuda_pending", [])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronised"))
    events = []
    monkeypatch.setattr(breakdown, "_cuda_event", lambda: events.append(_FakeEvent(10.0 * len(events)))
                        or events[-1])
    assert breakdown.close_step() == {}  # the first boundary
    clock = breakdown._SyncClock()
    first, last = clock.launched(_Bucket(False)), clock.launched(_Bucket(True))  # start: event 0
    clock.done(first)
    clock.done(last)  # the iteration's end: event 1, 10 ms after
    assert len(events) == 2
    assert breakdown.close_step()[breakdown.GRAD_SYNC] == 0.0  # the device is not there yet
    for event in events:
        event.passed = True
    assert breakdown.close_step()[breakdown.GRAD_SYNC] == 10.0  # counted at the next boundary
    assert breakdown.close_step()[breakdown.GRAD_SYNC] == 0.0  # and once


def test_timer_names():
    from jupyter_dlc import runtime

    assert runtime.timer("data").name == "data_wait_ms"
    assert runtime.timer("h2d").name == "h2d_ms"
    for bad, why in (("grad_sync", "measured by the runtime"), ("h 2d", "an identifier"), (3, "an identifier")):
        with pytest.raises(ValueError, match=why):
            runtime.timer(bad)


def test_only_the_loops_thread_counts(monkeypatch):
    """A section on another thread (a prefetching loader's) blocks no one: not counted."""
    import itertools
    import threading

    from jupyter_dlc import runtime
    from jupyter_dlc.runtime import breakdown

    ticks = itertools.count()
    monkeypatch.setattr(breakdown, "_clock", lambda: float(next(ticks)))  # a second a reading
    monkeypatch.setattr(breakdown, "_installed", True)
    monkeypatch.setattr(breakdown, "_last_boundary", None)
    breakdown.close_step()

    def prefetch():
        with runtime.timer("data"):
            pass

    thread = threading.Thread(target=prefetch)
    thread.start()
    thread.join()
    with runtime.timer("data"):
        with runtime.timer("data"):  # nested: counted once
            pass
    values = breakdown.close_step()
    assert values[breakdown.DATA_WAIT] == 1000.0 and values[breakdown.STEP] == 3000.0, values


def test_a_sync_timed_on_another_thread_is_counted_once_through_the_lock(monkeypatch):
    """A CPU DDP's sync is timed by autograd callbacks on the thread that calls backward: on
    the loop's thread it is added without a lock; a backward on another thread adds through
    `_add`'s lock, and the step that ends next counts both, once."""
    import threading

    from jupyter_dlc.runtime import breakdown

    monkeypatch.setattr(breakdown, "_installed", True)
    monkeypatch.setattr(breakdown, "_last_boundary", None)
    breakdown.close_step()  # the first boundary: this thread is the loop's
    sync = breakdown._sections[breakdown.GRAD_SYNC]
    sync.add(0.002)
    thread = threading.Thread(target=sync.add, args=(0.003,))
    thread.start()
    thread.join()
    assert sync.spent == 0.002 and breakdown._sums == {breakdown.GRAD_SYNC: 0.003}
    assert breakdown.close_step()[breakdown.GRAD_SYNC] == 5.0
    assert breakdown.close_step()[breakdown.GRAD_SYNC] == 0.0
