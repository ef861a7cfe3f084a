"""The job view (jupyter_dlc.widgets) against a real launcher and real torchrun jobs.

- the chart data rules (bounded lines, resumed attempts, rank 0 + mean past 8 ranks);
- JobView built in-process with a real client, refreshed synchronously: rank table, charts,
  log tail with its rank filter, Stop / Resume-from-step / Clone buttons going through the
  launcher, alert and diagnosis banners, the launcher killed and back;
- a notebook run headless by nbclient (`store_widget_state=True`) whose `%%dlc --wait` cell
  trains for real: the saved widget state holds the view (state, ranks, buttons, points).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from conftest import wait_for
from jupyter_dlc.widgets.series import BREAKDOWN_NAMES, Line, TrainData

TRAIN = """
import os, time, torch
from jupyter_dlc import runtime
info = runtime.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ckpt = runtime.Checkpointer(model=model, optimizer=opt)
step = ckpt.restore()
print(f"rank {info.rank} attempt {os.environ['DLC_ATTEMPT']} starts after step {step}", flush=True)
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
while step < 100000:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
    runtime.log(step, loss=loss.item(), lr=0.05, samples_per_s=640.0)
    if step % 10 == 0:
        ckpt.save(step)
        print(f"rank {info.rank} step {step}", flush=True)
    time.sleep(0.03)
"""

FAILING = """
import time
from jupyter_dlc import runtime
info = runtime.init()
for step in range(1, 31):
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.05)
print("WIDGET-ALERT-MARKER", flush=True)
time.sleep(1.5)   # the launcher evaluates alert rules every half second
if info.rank == 1:
    raise ValueError("synthetic failure in rank 1")
time.sleep(3)
"""


# -- the data rules, on their own ----------------------------------------------------------

def test_line_keeps_whole_history_within_capacity():
    line = Line(capacity=100)
    for step in range(1, 1001):
        line.append(step, float(step))
    assert len(line.x) < 100 and line.x[0] == 1 and line.x[-1] > 950
    assert line.x == sorted(line.x) and line.stride > 1
    kind, columns = line.take_new()
    assert kind == "reset" and columns["x"] == line.x  # a halving re-sends the line
    stride = line.stride
    for step in range(1001, 1001 + 3 * stride):
        line.append(step, 0.0)
    kind, columns = line.take_new()
    assert kind == "stream" and len(columns["x"]) == 3, "after halving, every stride-th point"


def test_train_data_resumed_attempt_and_mean_past_eight_ranks():
    small = TrainData(world_size=2, capacity=1000)
    seq = 0
    for attempt, steps in ((1, range(1, 31)), (2, range(21, 41))):
        for step in steps:
            for rank in (0, 1):
                seq += 1
                small.add({"seq": seq, "t": seq * 0.1, "attempt": attempt, "rank": rank,
                           "step": step, "kind": "train", "name": "loss", "value": float(step)})
    xs = small.lines["loss"][0].x
    assert xs == list(range(1, 41)), "attempt 2 resumed after step 20: steps 21-30 drawn once"
    assert small.keys == [0, 1] and small.steps_per_s() == pytest.approx(5.0)

    big = TrainData(world_size=16, capacity=1000)
    for step in (1, 2):
        for rank in range(16):
            big.add({"t": step, "attempt": 1, "rank": rank, "step": step, "kind": "train",
                     "name": "loss", "value": float(rank)})
    assert big.keys == ["mean"] and big.outliers == [], "an even spread has no outlier"
    mean = big.lines["loss"]["mean"]
    assert mean.y == [7.5, 7.5] and mean.cols["lo"] == [0.0, 0.0] and mean.cols["hi"] == [15.0, 15.0]


def read_as_a_view(data: TrainData, points: list[dict], read: int) -> None:
    """Feed `points` to `data` as a view past 8 ranks reads them from the launcher: `read`
    points an answer, each folded into band rows (jupyter_dlc/bands.py) but for the ranks
    that are outliers by then, whose points come as they are."""
    from jupyter_dlc.bands import BandFold

    for start in range(0, len(points), read):
        fold = BandFold(frozenset(data.outliers))
        for p in points[start:start + read]:
            if p["rank"] in fold.keep:
                data.add(p)
            else:
                fold.add(p["attempt"], p["name"], p["step"], p["t"], p["rank"], p["value"])
        for row in fold.rows():
            data.add_band(row)


def test_band_and_outlier_ranks_with_4096_ranks():
    """4,096 ranks: the chart keeps a mean with its min-max band and gives a line only to
    the ranks that stand out (rank 77 diverges from step 3, rank 4000 spikes at step 5),
    whether the launcher's answers cut steps in few places or many."""
    from jupyter_dlc.widgets.series import MAX_OUTLIERS, outlier_ranks

    world = 4096
    points = []
    for step in range(1, 9):
        for rank in range(world):
            value = 1.0 / step + (rank % 7) * 1e-3
            if rank == 77 and step >= 3:
                value += step          # diverges, and keeps diverging
            if rank == 4000 and step == 5:
                value = -50.0          # one spike
            points.append({"t": step, "attempt": 1, "rank": rank, "step": step, "kind": "train",
                           "name": "loss", "value": value})
    for read in (1000, 20000):
        data = TrainData(world_size=world, capacity=1000)
        read_as_a_view(data, points, read)
        mean = data.lines["loss"]["mean"]
        assert mean.x == list(range(1, 9)) and len(data.lines["loss"]) == 3
        assert mean.cols["hi"][4] == pytest.approx(1 / 5 + 5) and mean.cols["lo"][4] == -50.0
        assert mean.y[0] == pytest.approx(sum(p["value"] for p in points[:world]) / world)
        assert data.outliers == [77, 4000] and data.keys == ["mean", 77, 4000]
        assert data.lines["loss"][77].x == list(range(3, 9)), "rank 77's line from where it stood out"
        assert data.lines["loss"][77].y[-1] == pytest.approx(1 / 8 + 77 % 7 * 1e-3 + 8)
        # its later points: as they come once it is an outlier (the next answers), not
        # those the same answer had already folded, where it did not stand out
        assert data.lines["loss"][4000].x == ([5, 6, 7, 8] if read == 1000 else [5])
        assert data.steps_per_s() is not None
    assert outlier_ranks({r: 1.0 for r in range(10)}) == []
    assert outlier_ranks({0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0}) == [3]
    assert len(outlier_ranks({r: float(r * r * r) for r in range(100)}, MAX_OUTLIERS)) <= MAX_OUTLIERS


def test_a_band_waits_for_its_last_rank_then_draws_partially():
    """A rank that stopped logging holds its steps back until 64 newer steps wait; then the
    oldest are drawn from the ranks that logged them."""
    from jupyter_dlc.widgets.series import PENDING_STEPS

    data = TrainData(world_size=16, capacity=1000)
    points = [{"t": step, "attempt": 1, "rank": rank, "step": step, "kind": "train", "name": "loss",
               "value": 1.0} for step in range(1, PENDING_STEPS + 3) for rank in range(15)]
    read_as_a_view(data, points, 100)
    assert data.lines["loss"]["mean"].x == [1, 2]
    assert data.outliers == []


def test_band_lines_stay_in_step_order_and_a_drawn_step_is_not_drawn_again():
    """Band rows (the launcher's, bands.py) may complete a later step first, and a promoted
    rank's candidate values of pending steps join its line before an earlier one's: both
    lines keep step order. A value for a step already drawn (a rank that logged it twice)
    does not draw it again."""
    data = TrainData(world_size=16, capacity=1000)

    def row(step, n, outliers=()):
        return {"attempt": 1, "name": "loss", "step": step, "t": float(step), "n": n,
                "sum": float(n), "lo": 1.0, "hi": 1.0,
                "outliers": [{"rank": rank, "value": value} for rank, value in outliers]}

    for step in (7, 9):
        data.add_band(row(step, 8, [(3, 10.0 + step)]))
    data.add_band(row(5, 16, [(3, 15.0)]))  # drawn: rank 3 stands out, with its pending values
    assert data.outliers == [3] and data.lines["loss"][3].x == [5, 7, 9]
    data.add_band(row(8, 8, [(3, 18.0)]))  # its value of a step between
    assert data.lines["loss"][3].x == [5, 7, 8, 9]
    for step in (9, 7, 8):
        data.add_band(row(step, 8))
    mean = data.lines["loss"]["mean"]
    assert mean.x == [5, 7, 8, 9] and mean.reset, "drawn in step order, the line re-sent"
    data.add_band(row(8, 1))
    data.add({"t": 8.0, "attempt": 1, "rank": 3, "step": 8, "kind": "train", "name": "loss", "value": 1.0})
    assert mean.x == [5, 7, 8, 9] and not data._pending["loss"]


def test_the_launcher_pages_and_sorts_the_rank_table(tmp_path):
    """A view of 4,096 ranks reads one page of the rank table, sorted by the launcher in
    SQL (real SQLite): by rank, slowest step first, oldest heartbeat first, a rank with no
    step or heartbeat yet counting as lowest; a page past the end is the last."""
    from jupyter_dlc.launcher.store import RANK_ORDERS, Store
    from jupyter_dlc.widgets.ranktable import PAGE_SIZE, SORTS

    assert [key for key, _ in SORTS] == list(RANK_ORDERS), "the view offers the launcher's orders"
    store = Store(str(tmp_path / "db.sqlite"))
    store.insert_job("j", "j", {}, "token", str(tmp_path))
    store.init_ranks("j", 1, 512, 8)
    with store.tx() as db:
        db.executemany("UPDATE ranks SET last_step = ?, last_heartbeat = ?, state = 'running'"
                       " WHERE job_id = 'j' AND attempt = 1 AND rank = ?",
                       [(100 - (r == 4001) * 60 + r % 3, 1000.0 + r - (r == 17) * 900, r)
                        for r in range(4096) if r != 9])
    rows, page, total, states = store.rank_page("j", 1, "rank", 0, PAGE_SIZE)
    assert [r["rank"] for r in rows] == list(range(PAGE_SIZE)) and (page, total) == (0, 4096)
    assert states == {"running": 4095, "starting": 1}
    rows, page, _, _ = store.rank_page("j", 1, "rank", 10**6, PAGE_SIZE)
    assert page == -(-4096 // PAGE_SIZE) - 1 and rows[-1]["rank"] == 4095
    assert [r["rank"] for r in store.rank_page("j", 1, "step", 0, 2)[0]] == [9, 4001], "none yet, slowest"
    assert [r["rank"] for r in store.rank_page("j", 1, "heartbeat", 0, 2)[0]] == [9, 17]
    assert store.rank_page("j", 2, "step", 5, PAGE_SIZE)[:3] == ([], 0, 0)


def test_page_echo_of_a_stream_is_not_applied_twice():
    """jupyter_bokeh 4.1's page sends every applied patch, and the ranges it computed, back as
    "jsevent"s; the view's model drops them (the plain BokehModel applies them: shown too)."""
    from jupyter_bokeh import BokehModel

    from jupyter_dlc.widgets.charts import Charts, JobChartsModel
    from jupyter_dlc.widgets.series import SystemData

    def echo(model, source, xs):
        content = {"event": "jsevent", "kind": "ColumnsStreamed", "model": {"id": source.id},
                   "data": {"type": "map", "entries": [["x", xs], ["y", [0.0] * len(xs)]]},
                   "rollover": 100}
        model._sync_model(model, content, [])

    for cls, expected in ((BokehModel, [1, 2, 1, 2]), (JobChartsModel, [1, 2])):
        train = TrainData(world_size=1, capacity=100)
        charts = Charts("j", train, SystemData(100), 100)
        model = cls(charts.layout)
        for step in (1, 2):
            train.add({"t": step, "attempt": 1, "rank": 0, "step": step, "name": "loss", "value": 1.0})
        charts.push()
        echo(model, charts.train_sources[0], [1, 2])
        assert list(charts.train_sources[0].data["x"]) == expected, cls.__name__
        # the range BokehJS computed must not become a fixed range in the kernel
        model._sync_model(model, {"event": "jsevent", "kind": "ModelChanged",
                                  "model": {"id": charts.train_fig.x_range.id}, "attr": "end",
                                  "new": 2.0}, [])
        end = charts.train_fig.x_range.end
        assert (end == 2.0) == (cls is BokehModel), (cls.__name__, end)


def _patch_docs(model):
    """Record the comm messages `model` sends (its comm's publish_msg: what a kernel puts on
    the wire; outside a kernel the comm is ipywidgets' DummyComm, which sends nothing) and
    return a function that reassembles them into bokeh messages, as the page's Receiver does."""
    import asyncio

    from bokeh.protocol import Protocol
    from bokeh.protocol.receiver import Receiver

    wire: list = []

    def publish_msg(msg_type, data=None, metadata=None, buffers=None, **keys):
        if msg_type == "comm_msg":
            wire.append((data["content"], buffers))

    model.comm.publish_msg = publish_msg

    def messages() -> list:
        async def decode():
            receiver, out = Receiver(Protocol()), []
            for content, buffers in wire:
                assert content["msg"] == "patch"
                fragment = content["payload"] if "payload" in content else bytes(buffers[0])
                message = await receiver.consume(fragment)
                if message is not None:
                    out.append(message)
            return out
        out = asyncio.run(decode())
        wire.clear()
        return out
    return messages


def test_one_draw_is_one_patch_doc_with_one_stream_per_line():
    """A view's draw of several lines (two ranks' loss, two nodes' utilisation) and a title
    leaves as ONE PATCH-DOC holding one ColumnsStreamed per line with all its new points;
    jupyter_bokeh alone sends a PATCH-DOC (3 comm messages) per change."""
    from jupyter_dlc.widgets.charts import Charts, JobChartsModel
    from jupyter_dlc.widgets.series import SystemData

    def add_points(train, system, steps):
        for step in steps:
            for rank in (0, 1):
                train.add({"t": step, "attempt": 1, "rank": rank, "step": step, "name": "loss",
                           "value": 1.0 / step})
            for node in (0, 1):
                system.add({"t": 1000.0 + step, "node": node, "name": "cpu_util", "value": 0.5})

    train, system = TrainData(world_size=2, capacity=100), SystemData(100)
    charts = Charts("j", train, system, 100)
    model = JobChartsModel(charts.layout)
    messages = _patch_docs(model)
    add_points(train, system, range(1, 6))
    with model.batch():
        charts.push()  # adds two system lines, streams four lines, sets the system title
    [first] = messages()
    assert first.msgtype == "PATCH-DOC" and model.patches_sent == 1
    add_points(train, system, range(6, 11))
    with model.batch():
        assert charts.push() == 20
    [patch] = messages()
    assert model.patches_sent == 2
    events = patch.content["events"]
    assert [e["kind"] for e in events] == ["ColumnsStreamed"] * 4, events
    streamed = {e["model"]["id"]: e["data"] for e in events}
    sources = [*charts.train_sources.values(), *charts.sys_sources.values()]
    assert sorted(streamed) == sorted(s.id for s in sources)
    xs = streamed[charts.train_sources[0].id]["entries"]
    assert dict((k, list(v)) for k, v in xs)["x"] == [6, 7, 8, 9, 10]

    # outside a batch every change is a message of its own (jupyter_bokeh's way)
    add_points(train, system, range(11, 13))
    charts.push()
    assert len(messages()) == 4 and model.patches_sent == 6


def test_utilisation_lines_come_from_a_pool_so_the_first_samples_change_no_renderers():
    """A plot whose renderers change is laid out whole again by BokehJS (hundreds of ms of
    the page, benchmarks/RESULTS.md); the first samples claim hidden lines made with the
    charts: the patch that shows them sets visibility, names, colours and labels, and adds
    no renderer. Past the pool, lines are added as before."""
    from jupyter_dlc.widgets.charts import SYSTEM_LINE_POOL, Charts, JobChartsModel
    from jupyter_dlc.widgets.series import SystemData, label_for

    train, system = TrainData(world_size=2, capacity=100), SystemData(100)
    charts = Charts("j", train, system, 100)
    model = JobChartsModel(charts.layout)
    messages = _patch_docs(model)
    renderers = list(charts.sys_fig.renderers)
    for node in (0, 1):
        for name in ("cpu_util", "mem_used"):
            system.add({"t": 1000.0, "node": node, "name": name, "value": 0.5})
    with model.batch():
        charts.push()
    assert list(charts.sys_fig.renderers) == renderers
    [patch] = messages()
    changed = {e.get("attr") for e in patch.content["events"] if e["kind"] == "ModelChanged"}
    assert "renderers" not in changed and {"visible", "label", "name"} <= changed, changed
    shown = [item for item in charts.sys_legend.items if item.visible]
    assert sorted(item.label for item in shown) == sorted(
        label_for((node, "cpu", name)) for node in (0, 1) for name in ("cpu_util", "mem_used"))
    assert charts.sys_sources[(1, "cpu", "mem_used")].name == "dlc-sys-1-cpu-mem_used"
    assert charts.sys_sources[(1, "cpu", "mem_used")].data["y"] == [0.5]
    # More devices than the pool holds: the rest are added.
    for gpu in range(SYSTEM_LINE_POOL):
        system.add({"t": 1001.0, "node": 0, "device": f"gpu{gpu}", "name": "gpu_util", "value": 0.9})
    charts.push()
    assert len(charts.sys_sources) == 4 + SYSTEM_LINE_POOL
    assert len(charts.sys_fig.renderers) == len(renderers) + 4

# -- JobView in-process against a real launcher -----------------------------------------------

def refresh_until(view, predicate, timeout=90.0, what="condition"):
    def check():
        job = view.refresh_now()
        return job is not None and predicate(job)
    return wait_for(check, timeout=timeout, interval=0.2, what=what)


def chart_steps(view, key=0):
    return list(view.charts.train_sources[key].data["x"])


def log_text(view):
    return re.sub(r"<[^>]+>", "", view.log_view.value)


def test_job_view_live_stop_resume_clone(shared_launcher):
    from jupyter_dlc.widgets import JobView

    client = shared_launcher.client
    script = shared_launcher.script("train_view.py", TRAIN)
    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 1, "name": "view",
                         "heartbeat_interval": 1.0, "workdir": shared_launcher.root})
    view = JobView(client, job["id"])  # no thread: the test drives refresh_now()
    assert "Stop" == view.stop_button.description and view.resume_button.description == "Resume"

    refresh_until(view, lambda j: j["state"] == "RUNNING" and len(chart_steps(view, 0)) >= 25
                  and len(chart_steps(view, 1)) >= 25 and len(view.charts.sys_sources) >= 4,
                  what="25 steps of each rank drawn and system samples of both nodes")
    assert 'data-state="RUNNING"' in view.header.value
    assert re.findall(r'class="dlc-rank" data-rank="(\d+)"', view.rank_table.value) == ["0", "1"]
    for key in (0, 1):
        steps = chart_steps(view, key)
        assert steps == sorted(steps) and steps[0] == 1
    # what the script logs, and the step breakdown the runtime adds (runtime/breakdown.py)
    assert set(view.metric_select.options) == {"loss", "lr", "samples_per_s", *BREAKDOWN_NAMES}
    assert "steps/s" in view.header.value and "1,280 samples/s" in view.header.value
    # utilisation: one line per node, named for what the node has
    devices = {(node, device) for node, device, _ in view.charts.sys_sources}
    assert {node for node, _ in devices} == {0, 1}
    title = view.charts.sys_fig.title.text
    if any(d.startswith("gpu") for _, d in devices):
        assert title.startswith("GPU util")
    else:
        assert title.startswith("no GPU: CPU util") and ("cpu" in {d for _, d in devices})
    # log tail with its rank filter
    wait_for(lambda: view.refresh_now() and "[1] rank 1 step" in log_text(view), what="rank 1 log")
    view.log_filter.value = 1
    assert "[1] rank 1" in log_text(view) and "[0] rank 0" not in log_text(view)
    view.log_filter.value = -1
    # another metric from the dropdown
    view.metric_select.value = "lr"
    assert set(view.charts.train_sources[0].data["y"]) == {0.05}
    view.metric_select.value = "loss"

    # Stop through the button: the ranks checkpoint and the job ends STOPPED
    view.stop_button.click()
    refresh_until(view, lambda j: j["state"] == "STOPPED", what="STOPPED")
    assert 'data-state="STOPPED"' in view.header.value
    assert view.stop_button.disabled and not view.resume_button.disabled
    committed = [c["step"] for c in client.checkpoints(job["id"])]
    assert committed and [v for _, v in view.resume_steps.options] == sorted(committed, reverse=True)
    stopped_at = max(chart_steps(view))

    # Resume from an older committed step: attempt 2 continues from there, the chart too
    step = sorted(committed)[-2] if len(committed) > 1 else committed[-1]
    view.resume_steps.value = step
    view.resume_button.click()
    refresh_until(view, lambda j: j["attempt"] == 2 and max(chart_steps(view)) > stopped_at + 3,
                  what="attempt 2 drawn past where attempt 1 stopped")
    steps = chart_steps(view)
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "one point per step"
    assert step in steps and step + 1 in steps
    assert steps.index(step + 1) == steps.index(step) + 1
    assert steps[:steps.index(step) + 1] == list(range(1, step + 1)), "attempt 1 kept up to the step"
    assert 'class="dlc-attempt">2<' in view.header.value
    refresh_until(view, lambda j: f"attempt 2 starts after step {step}" in log_text(view),
                  timeout=15, what="attempt 2 log lines")
    assert log_text(view).index("--- attempt 2 ---") < log_text(view).index("attempt 2 starts")

    # Clone: a new job from the same spec, and the view follows it
    original = view.job_id
    view.clone_button.click()
    assert view.job_id != original and client.job(view.job_id)["spec"]["nodes"] == 2
    assert chart_steps(view) == []
    refresh_until(view, lambda j: "clone of " + original in view.header.value, what="clone note")
    client.stop(original)
    view.stop_button.click()
    refresh_until(view, lambda j: j["state"] == "STOPPED", what="the clone STOPPED")
    client.wait(original, timeout=60)


def test_job_view_banners_and_launcher_restart(shared_launcher):
    from jupyter_dlc.widgets import JobView

    client = shared_launcher.client
    script = shared_launcher.script("fail_view.py", FAILING)
    job = client.submit({"script": script, "nodes": 2, "nproc_per_node": 1, "name": "failing",
                         "max_restarts": 0, "alerts": ["log matches /WIDGET-ALERT-MARKER/"],
                         "workdir": shared_launcher.root})
    view = JobView(client, job["id"])
    refresh_until(view, lambda j: "dlc-banner-alert" in view.banner.value, what="alert banner")
    assert "WIDGET-ALERT-MARKER" in view.banner.value
    refresh_until(view, lambda j: j["state"] == "FAILED", what="FAILED")
    refresh_until(view, lambda j: "dlc-banner-diagnosis" in view.banner.value, timeout=10,
                  what="diagnosis banner")
    diagnoses = client.diagnosis(job["id"])
    assert diagnoses and diagnoses[-1]["class"] in view.banner.value
    assert "synthetic failure" in view.banner.value or "ValueError" in view.banner.value
    assert re.search(r'data-rank="1" style="color:#c62828"', view.rank_table.value)

    # the launcher dies: the view keeps what it shows, says so, and comes back with it
    drawn = chart_steps(view) + chart_steps(view, 1)
    assert drawn and set(drawn) <= set(range(1, 31))
    os.kill(shared_launcher.pid(), 9)
    wait_for(lambda: not client.alive(), timeout=10, what="launcher gone")
    assert view.refresh_now() is None
    assert "launcher unreachable" in view.banner.value
    assert chart_steps(view) + chart_steps(view, 1) == drawn
    shared_launcher.client = type(client).connect()
    refresh_until(view, lambda j: j["state"] == "FAILED", timeout=30, what="launcher back")
    assert "launcher unreachable" not in view.banner.value
    assert chart_steps(view) + chart_steps(view, 1) == drawn, "no point lost or drawn twice"
    assert "dlc-banner-diagnosis" in view.banner.value


def test_view_thread_ends_after_job_and_restarts_on_resume(shared_launcher):
    """The updater thread polls alone (no refresh_now from the test), stops after the job
    ended, and a Resume starts it again."""
    from jupyter_dlc.widgets import JobView

    client = shared_launcher.client
    script = shared_launcher.script("short_view.py", TRAIN.replace("100000", "40"))
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 1, "name": "short",
                         "workdir": shared_launcher.root})
    view = JobView(client, job["id"], ended_interval=0.5)
    view.start()
    assert view.join(timeout=120), "thread still running after the job ended"
    assert client.job(job["id"])["state"] == "SUCCEEDED"
    assert chart_steps(view) == list(range(1, 41))
    assert 'data-state="SUCCEEDED"' in view.header.value
    bundle = json.dumps(view.bokeh.render_bundle, default=str)
    assert '"dlc-train-0"' in bundle  # the final re-send carries the data source
    refreshes = view.refreshes
    time.sleep(1.0)
    assert view.refreshes == refreshes, "an ended job is no longer polled"
    view.resume(30)
    wait_for(lambda: view.refreshes > refreshes, timeout=5, what="thread restarted")
    assert view.join(timeout=120)
    assert view.job["attempt"] == 2 and view.job["state"] == "SUCCEEDED"
    assert chart_steps(view) == list(range(1, 41))


# -- a notebook run headless -------------------------------------------------------------------

NOTEBOOK_CELL = """%%dlc --nodes 2 --nproc-per-node 1 --wait --heartbeat-interval 1s --name wstate
import time
from jupyter_dlc import runtime
info = runtime.init()
for step in range(1, 41):
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.05)
print(f"rank {info.rank} done", flush=True)
"""


def test_notebook_saves_view_widget_state(shared_launcher, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext jupyter_dlc"),
                nbformat.v4.new_code_cell(NOTEBOOK_CELL)]
    NotebookClient(nb, timeout=180, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = list(state.values())

    def values(name):
        return [m["state"].get("value", "") for m in models if m["model_name"] == name]

    html_values = values("HTMLModel")
    header = [v for v in html_values if "dlc-header" in v]
    assert header and 'data-state="SUCCEEDED"' in header[-1]
    table = [v for v in html_values if 'class="dlc-ranks"' in v][-1]
    rows = re.findall(r'class="dlc-rank" data-rank="(\d+)"', table)
    assert rows == ["0", "1"] and table.count(">exited<") == 2
    assert re.findall(r"<td[^>]*>40</td>", table), "last step 40 in the rank table"
    logs = [v for v in html_values if "dlc-logs" in v][-1]
    assert "[0] rank 0 done" in logs and "[1] rank 1 done" in logs
    buttons = {m["state"].get("description") for m in models if m["model_name"] == "ButtonModel"}
    assert {"Stop", "Resume", "Clone"} <= buttons
    sources = saved_sources(models, "dlc-train-")
    assert set(sources) == {"dlc-train-0", "dlc-train-1"}
    xs = _column(sources["dlc-train-0"], "x")
    assert xs == list(range(1, 41)), xs


def saved_sources(models: list[dict], prefix: str) -> dict:
    """{name: data} of the named bokeh data sources in the last chart widget a notebook saved."""
    bokeh = [m for m in models if m["model_name"] == "BokehModel"]
    assert bokeh, "the charts widget is in the saved state"
    bundle = bokeh[-1]["state"]["render_bundle"]
    bundle = json.loads(bundle) if isinstance(bundle, str) else bundle
    sources = {}
    for node in _walk(bundle["docs_json"]):
        attributes = node.get("attributes")
        if isinstance(attributes, dict) and str(attributes.get("name")).startswith(prefix) \
                and "data" in attributes:
            sources[attributes["name"]] = attributes["data"]
    return sources


def _walk(node):
    """Every dict in a JSON tree."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _column(data, key):
    """A bokeh-serialized column: a plain list, or {"type": "ndarray", "array": ...}."""
    entries = data.get("entries") if isinstance(data, dict) and data.get("type") == "map" else None
    if entries is not None:
        data = dict(entries)
    column = data[key]
    if isinstance(column, dict) and column.get("type") == "ndarray":
        array = column["array"]
        if isinstance(array, dict) and array.get("type") == "bytes":
            import base64
            import struct

            raw = base64.b64decode(array["data"])
            fmt = {"float64": "d", "int32": "i", "float32": "f", "int64": "q"}[column["dtype"]]
            return [int(v) if float(v).is_integer() else v
                    for v in struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw)]
        column = array
    return [int(v) if float(v).is_integer() else v for v in column]
