"""Metric points pushed to the notebook view (issue 14), with real parts: a real launcher on
loopback, real torchrun jobs, and a real kernel run by nbclient.

- the launcher's `metrics/stream` route sends every stored point once, in seq order, and
  checks its token and job;
- a JobView with its threads running draws pushed points without polling metrics; when
  the stream is cut it polls (no point lost or drawn twice) and goes back to the stream;
- in a kernel, a `%%dlc` cell's view receives its points from the stream.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from conftest import wait_for

LOGGER = """
import time
from jupyter_dlc import runtime
runtime.init()
for step in range(1, {steps} + 1):
    runtime.log(step, loss=1.0 / step)
    time.sleep({sleep})
"""


def test_metrics_stream_pushes_every_point_once(shared_launcher):
    client = shared_launcher.client
    script = shared_launcher.script("push_route.py", LOGGER.format(steps=60, sleep=0.02))
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "name": "push-route"})
    seqs, steps, summaries = [], set(), []
    for event, data in client.metrics_stream(job["id"], since=0):
        if event == "metrics":
            seqs += [p["seq"] for p in data["points"]]
            assert data["last_seq"] == data["points"][-1]["seq"]
            steps |= {(p["rank"], p["step"]) for p in data["points"] if p["name"] == "loss"}
        elif event == "job":
            summaries.append(data)
        if len(steps) == 120:
            break
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)), "each point once, in order"
    stored = [p["seq"] for p in client.metrics(job["id"])["points"]]
    assert seqs == stored[:len(seqs)]
    assert summaries and summaries[0]["id"] == job["id"]
    # from a seq on: only what follows it
    middle = seqs[len(seqs) // 2]
    event, data = next(e for e in client.metrics_stream(job["id"], since=middle) if e[0] == "metrics")
    assert data["points"][0]["seq"] > middle
    client.wait(job["id"], timeout=120)
    # every route checks its token, and its job
    url = f"{client.url}/api/jobs/{job['id']}/metrics/stream"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    with pytest.raises(Exception) as missing:
        next(client.metrics_stream("no-such-job"))
    assert getattr(missing.value, "status", None) == 404


def test_view_draws_pushed_points_and_polls_while_the_stream_is_cut(shared_launcher):
    from jupyter_dlc.widgets import JobView

    client = shared_launcher.client
    script = shared_launcher.script("push_view.py", LOGGER.format(steps=400, sleep=0.03))
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "name": "push-view"})
    view = JobView(client, job["id"])
    view.start()  # the updater and the stream follower, as under a cell
    try:
        wait_for(lambda: view.points_pushed >= 40 and view._push.state == "live",
                 timeout=120, what="40 pushed points")
        assert view.points_polled == 0, "metrics were polled while the stream was live"
        view._push.cut()
        wait_for(lambda: view.points_polled > 0, timeout=60, what="a metrics poll after the cut")
        pushed = view.points_pushed
        wait_for(lambda: view._push.state == "live" and view.points_pushed > pushed + 20,
                 timeout=60, what="the stream back after the cut")
        assert view._push.drops >= 1
        client.stop(job["id"])
        wait_for(lambda: view.job and view.job["state"] == "STOPPED", timeout=90, what="STOPPED")
        assert view.join(30), "the updater ended with the job"
        wait_for(lambda: view._push is None, timeout=10, what="the follower released")
        # every stored point drawn once: rank 0's line has each step once, in order
        stored = sorted(p["step"] for p in client.metrics(job["id"])["points"]
                        if p["rank"] == 0 and p["name"] == "loss")
        xs = list(view.charts.train_sources[0].data["x"])
        assert xs == stored, "a point lost or drawn twice across the cut"
    finally:
        view.close()


PUSHED_CELL = """%%dlc --nodes 1 --nproc-per-node 2 --name pushnb
import time
from jupyter_dlc import runtime
runtime.init()
for step in range(1, 201):
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.03)
"""

CHECK_CELL = """
import time
from jupyter_dlc.widgets import views
view = views()[-1]
deadline = time.time() + 120
while time.time() < deadline and not (view.points_pushed >= 50 and view._push is not None
                                      and view._push.state == "live"):
    time.sleep(0.05)
print("PUSHED", view.points_pushed, "POLLED", view.points_polled,
      "STATE", view._push.state if view._push else None)
view.stop()
"""


def test_kernel_view_receives_pushed_points(shared_launcher, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext jupyter_dlc"),
                nbformat.v4.new_code_cell(PUSHED_CELL), nbformat.v4.new_code_cell(CHECK_CELL)]
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    words = text.split()
    assert "PUSHED" in words, text
    pushed, polled = int(words[words.index("PUSHED") + 1]), int(words[words.index("POLLED") + 1])
    assert pushed >= 50 and polled == 0 and words[words.index("STATE") + 1] == "live", text
    job = shared_launcher.client.jobs()
    for j in job:
        if j["name"] == "pushnb":
            shared_launcher.client.wait(j["id"], timeout=90)
