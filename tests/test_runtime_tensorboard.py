"""TensorBoard event files from runtime.log(): real jobs, read back with TensorBoard's own reader."""

from __future__ import annotations

import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jupyter_dlc.runtime import tensorboard as runtime_tensorboard
from jupyter_dlc.runtime.env import rank_info


def scalars(run_dir: str, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(run_dir)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def runs(job_dir: str) -> list[str]:
    root = os.path.join(job_dir, "tensorboard")
    return sorted(os.path.relpath(path, root) for path, _, files in os.walk(root)
                  if any(f.startswith("events.out.tfevents") for f in files))


TRAIN = """
    import os
    from jupyter_dlc import runtime
    info = runtime.init()
    for step in range(1, 11):
        runtime.log(step, loss=1.0 / step + info.rank, lr=0.1)
        if step == 6 and info.attempt == 1 and info.rank == 1 and os.environ.get("FAIL_ONCE"):
            raise RuntimeError("fail once")
    """


def test_rank_zero_writes_every_logged_value_by_default(launcher):
    script = launcher.script("train.py", TRAIN)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    job_dir = os.path.join(launcher.data_dir, "jobs", job["id"])
    assert runs(job_dir) == [os.path.join("attempt-1", "rank-0")]
    run = os.path.join(job_dir, "tensorboard", "attempt-1", "rank-0")
    assert scalars(run, "loss") == [(s, pytest.approx(1.0 / s)) for s in range(1, 11)]
    assert [v for _, v in scalars(run, "lr")] == [pytest.approx(0.1)] * 10


def test_all_ranks_write_one_run_per_attempt(launcher):
    script = launcher.script("train.py", TRAIN)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "max_restarts": 1,
                                  "env": {"DLC_TENSORBOARD": "all", "FAIL_ONCE": "1"}})
    job = launcher.client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED" and job["attempt"] == 2, job["reason"]
    job_dir = os.path.join(launcher.data_dir, "jobs", job["id"])
    assert runs(job_dir) == [os.path.join(f"attempt-{a}", f"rank-{r}") for a in (1, 2) for r in (0, 1)]
    # Rank 1 failed in step 6 of attempt 1, after logging it (its exit handlers flush the
    # writer before its exit is recorded); attempt 2 ran every step again (nothing was
    # checkpointed), in a run of its own.
    first = scalars(os.path.join(job_dir, "tensorboard", "attempt-1", "rank-1"), "loss")
    assert [s for s, _ in first] == list(range(1, 7))
    second = scalars(os.path.join(job_dir, "tensorboard", "attempt-2", "rank-1"), "loss")
    assert second == [(s, pytest.approx(1.0 / s + 1)) for s in range(1, 11)]


def test_off_writes_nothing(launcher):
    script = launcher.script("train.py", TRAIN)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 1,
                                  "env": {"DLC_TENSORBOARD": "off"}})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert not os.path.exists(os.path.join(launcher.data_dir, "jobs", job["id"], "tensorboard"))


@pytest.mark.parametrize("value, rank, expected", [
    ("", 0, "attempt-2/rank-0"), ("", 1, None), ("all", 1, "attempt-2/rank-1"),
    ("off", 0, None), ("0", 0, None), ("1", 0, "attempt-2/rank-0"), ("sometimes", 0, None),
])
def test_mode_decides_who_writes(monkeypatch, capsys, value, rank, expected):
    monkeypatch.setenv("DLC_TENSORBOARD", value)
    monkeypatch.setenv("DLC_JOB_DIR", "/jobs/j1")
    monkeypatch.setenv("DLC_ATTEMPT", "2")
    monkeypatch.setenv("RANK", str(rank))
    path = runtime_tensorboard.log_dir(rank_info())
    assert path == (None if expected is None else os.path.join("/jobs/j1", "tensorboard", expected))
    if value == "sometimes":
        err = capsys.readouterr().err
        assert "DLC_TENSORBOARD='sometimes' is not one of rank0, all, off" in err


def test_outside_a_job_nothing_is_written(monkeypatch):
    monkeypatch.delenv("DLC_JOB_DIR", raising=False)
    monkeypatch.setenv("DLC_TENSORBOARD", "all")
    assert runtime_tensorboard.log_dir(rank_info()) is None
