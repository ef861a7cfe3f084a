"""Sweeps: axes expanded into trials, each a real torchrun job under a real launcher, at most
`--parallel` of them at once; the sweep's table from the CLI and its view in a real kernel."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import types

import pytest
from test_notebook import run_notebook
from test_widgets import _column, saved_sources

from jupyter_dlc import sweeps
from jupyter_dlc.client import LauncherError
from jupyter_dlc.export import export_job
from jupyter_dlc.spec import JobSpec, SpecError, params_env
from jupyter_dlc.states import TERMINAL_STATES

TRIAL = """
import os
from jupyter_dlc import runtime

runtime.init()
p = runtime.params(lr=1.0, batch=1)
print("params", {k: (v, type(v).__name__) for k, v in sorted(p.items())},
      os.environ["DLC_PARAM_LR"], os.environ.get("DLC_PARAM_BATCH"), flush=True)
for step in range(1, 11):
    runtime.log(step, loss=p["lr"] * p["batch"] / step)
"""


def test_a_grid_is_every_point_in_order_and_a_random_sweep_repeats_with_its_seed():
    grid = sweeps.expand(["lr=1e-3,3e-4", "batch=32,64,128"])
    assert grid == [{"lr": 1e-3, "batch": b} for b in (32, 64, 128)] + \
                   [{"lr": 3e-4, "batch": b} for b in (32, 64, 128)]
    drawn = sweeps.expand(["lr=loguniform(1e-4,1e-2)", "act=choice(relu,gelu)", "n=randint(2,5)"],
                          trials=50, seed=7)
    assert drawn == sweeps.expand(["lr=loguniform(1e-4,1e-2)", "act=choice(relu,gelu)", "n=randint(2,5)"],
                                  trials=50, seed=7)
    assert drawn != sweeps.expand(["lr=loguniform(1e-4,1e-2)", "act=choice(relu,gelu)", "n=randint(2,5)"],
                                  trials=50, seed=8)
    assert all(1e-4 <= t["lr"] <= 1e-2 and t["act"] in ("relu", "gelu") and t["n"] in (2, 3, 4) for t in drawn)
    # log-uniform: about as many draws below 1e-3 (the geometric middle) as above
    assert 15 < sum(t["lr"] < 1e-3 for t in drawn) < 35
    mixed = sweeps.expand(["batch=32,64", "lr=uniform(0,1)"], trials=3)
    assert [t["batch"] for t in mixed] == [32, 32, 32, 64, 64, 64]
    assert sweeps.expand(["opt=adam,sgd", "wd=0", "nesterov=true"]) == [
        {"opt": "adam", "wd": 0, "nesterov": True}, {"opt": "sgd", "wd": 0, "nesterov": True}]


@pytest.mark.parametrize("axes, trials, says", [
    (["lr"], None, "sweep: expected NAME=VALUES"),
    (["a;b=1,2"], None, "sweep: 'a;b' is not a parameter name"),
    (["$(id)=1"], None, "sweep: '$(id)' is not a parameter name"),
    (["1lr=1"], None, "sweep: '1lr' is not a parameter name"),
    (["lr=1,,2"], None, "sweep: lr: a value is empty"),
    (["lr="], None, "sweep: lr: a value is empty"),
    (["lr=1", "lr=2"], None, "sweep: lr is swept twice"),
    (["lr=loguniform(0,1)"], 4, "sweep: lr: loguniform needs a low bound above 0"),
    (["lr=uniform(1,1)"], 4, "sweep: lr: uniform(low,high) needs two numbers, low below high"),
    (["lr=uniform(a,b)"], 4, "sweep: lr: uniform(low,high) needs two numbers"),
    (["n=randint(1.5,3)"], 4, "sweep: n: randint(low,high) takes whole numbers"),
    (["lr=uniform(0,1)"], None, "trials: lr is drawn at random: say how many trials"),
    (["lr=uniform(0,1)"], 0, "trials: must be between 1 and 1000"),
    (["a=" + ",".join(map(str, range(40))), "b=" + ",".join(map(str, range(40)))], None,
     "sweep: 1600 trials; at most 1000"),
])
def test_a_sweep_that_cannot_be_is_refused_in_one_line_naming_the_option(axes, trials, says):
    with pytest.raises(SpecError) as caught:
        sweeps.expand(axes, trials)
    assert str(caught.value).startswith(says), caught.value
    assert "\n" not in str(caught.value)


def test_trial_params_reach_the_spec_checked_and_the_ranks_as_variables(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    base = JobSpec(script=str(script), name="lrs").validate()
    specs = sweeps.trial_specs(base, sweeps.expand(["lr=0.1,0.2", "tag=a b"]), parallel=2, sweep_id="s-1")
    assert [(s.name, s.params, s.sweep) for s in specs] == [
        ("lrs-0", {"lr": 0.1, "tag": "a b"}, {"id": "s-1", "trial": 0, "parallel": 2}),
        ("lrs-1", {"lr": 0.2, "tag": "a b"}, {"id": "s-1", "trial": 1, "parallel": 2})]
    assert params_env({"lr": 0.1, "batch": 32, "amp": True, "tag": "a b"}) == {
        "DLC_PARAMS": '{"amp": true, "batch": 32, "lr": 0.1, "tag": "a b"}', "DLC_PARAM_LR": "0.1",
        "DLC_PARAM_BATCH": "32", "DLC_PARAM_AMP": "true", "DLC_PARAM_TAG": "a b"}
    for params, says in (({"lr": float("nan")}, "params.lr: expected a finite number"),
                         ({"tag": "a\nrm -rf ~"}, "params.tag: contains a control character"),
                         ({"a-b": 1}, "params: 'a-b' is not a parameter name"),
                         ({"lr": 1, "LR": 2}, "params: two names differ only in case"),
                         ({"lr": [1]}, "params.lr: expected a finite number, true, false or a string")):
        with pytest.raises(SpecError) as caught:
            JobSpec(script=str(script), params=params).validate()
        assert str(caught.value).startswith(says), caught.value
    for sweep, says in (({"id": "x y"}, "sweep.id: expected letters"), ({"trial": 1}, "sweep: expected"),
                        ({"id": "s", "parallel": 0}, "sweep.parallel: must be between 1 and 1024")):
        with pytest.raises(SpecError) as caught:
            JobSpec(script=str(script), sweep=sweep).validate()
        assert str(caught.value).startswith(says), caught.value
    options = types.SimpleNamespace(sweep=[], trials=3, parallel=None, sweep_seed=0)
    with pytest.raises(SpecError, match="^trials: only applies to a sweep"):
        sweeps.from_options(options, base)


def active_intervals(client, job_id: str) -> tuple[float, float]:
    """From leaving QUEUED to the end: what the sweep's `parallel` bounds."""
    events = [e for e in client.events(job_id) if e["type"] == "state"]
    start = next(e["t"] for e in events if e["state"] != "QUEUED")
    end = next(e["t"] for e in events if e["state"] in TERMINAL_STATES)
    return start, end


def test_a_2x3_grid_with_parallel_2_runs_six_jobs_two_at_a_time_on_a_warm_pool(launcher):
    client = launcher.client
    client.pool_up(1, 1)
    script = launcher.script("trial.py", TRIAL)
    run = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "run", script, "--name", "grid",
                          "--sweep", "lr=0.5,0.25", "--sweep", "batch=1,2,4", "--parallel", "2", "--wait"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    sweep_id = re.match(r"sweep (\S+): 6 trials", run.stdout).group(1)
    jobs = sorted((j for j in client.jobs() if (j.get("sweep") or {}).get("id") == sweep_id),
                  key=lambda j: j["sweep"]["trial"])
    assert [j["name"] for j in jobs] == [f"grid-{k}" for k in range(6)]
    assert [j["params"] for j in jobs] == [{"lr": lr, "batch": b} for lr in (0.5, 0.25) for b in (1, 2, 4)]
    assert all(j["state"] == "SUCCEEDED" for j in jobs)

    # Never more than two past QUEUED at once, and never fewer than two while some waited.
    spans = [active_intervals(client, j["id"]) for j in jobs]
    moments = sorted(t for span in spans for t in span)
    overlap = [sum(1 for s, e in spans if s <= t < e) for t in moments]
    assert max(overlap) == 2, spans
    starts = [j.get("attempts", [{}]) for j in jobs]
    assert starts  # every trial ran one attempt; the pool took some of them
    starts = [client.job(j["id"])["attempts"][0].get("start") or "" for j in jobs]
    assert any(s.startswith("warm pool") for s in starts), starts

    # Each trial's ranks saw its values, typed, in runtime.params() and DLC_PARAM_<NAME>.
    for job in jobs:
        log = "\n".join(line["text"] for line in client.logs(job["id"], rank=0)["lines"])
        lr, batch = job["params"]["lr"], job["params"]["batch"]
        assert f"params {{'batch': ({batch}, 'int'), 'lr': ({lr}, 'float')}} {lr} {batch}" in log, log

    # The table: every trial, its values, its last and best loss; the best marked.
    table = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "sweep", sweep_id],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    lines = table.splitlines()
    assert lines[0].split() == ["TRIAL", "JOB", "STATE", "LR", "BATCH", "STEP", "LAST", "LOSS", "BEST", "LOSS"]
    assert len(lines) == 7 and all("SUCCEEDED" in line for line in lines[1:])
    assert lines[1].split()[3:] == ["0.5", "1", "10", "0.05", "0.05"]
    marked = [line for line in lines[1:] if line.endswith("*")]
    assert len(marked) == 1 and marked[0].split()[1] == jobs[3]["id"]  # lr 0.25, batch 1
    # A trial's bundle carries its values: run.sh gives the ranks the same runtime.params().
    bundle = launcher.root + "/trial-bundle"
    export_job(client, jobs[4]["id"], bundle)
    ran = subprocess.run(["./run.sh", "all"], cwd=bundle, capture_output=True, text=True, timeout=240,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("DLC_", "MASTER_"))})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "params {'batch': (2, 'int'), 'lr': (0.25, 'float')} 0.25 2" in ran.stdout

    with pytest.raises(LauncherError, match="^sweep: no trials of sweep 'nope'"):
        try:
            sweeps.trials_of(client, "nope")
        except SpecError as error:
            raise LauncherError(str(error)) from None


def test_the_cell_of_a_sweep_becomes_its_live_table_and_curves(shared_launcher, tmp_path):
    nb = run_notebook(["%load_ext jupyter_dlc",
                       "%%dlc --sweep lr=0.5,0.25,0.125 --parallel 2 --name cellsweep --wait\n" + TRIAL],
                      str(tmp_path))
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = list(state.values())
    html_values = [m["state"].get("value", "") for m in models if m["model_name"] == "HTMLModel"]
    header = [v for v in html_values if "dlc-sweep-header" in v][-1]
    assert "3 trials (3 succeeded), 2 at a time" in header, header
    table = [v for v in html_values if 'class="dlc-sweep"' in v][-1]
    rows = re.findall(r'<tr class="dlc-trial[^"]*" data-trial="(\d)" data-state="(\w+)"', table)
    assert rows == [("0", "SUCCEEDED"), ("1", "SUCCEEDED"), ("2", "SUCCEEDED")]
    assert "<th>lr</th>" in table and "<td>0.125</td>" in table
    best = re.search(r'<tr class="dlc-trial dlc-best" data-trial="(\d)"', table)
    assert best and best.group(1) == "2"
    sources = saved_sources(models, "dlc-trial-")
    assert set(sources) == {"dlc-trial-0", "dlc-trial-1", "dlc-trial-2"}
    ys = _column(sources["dlc-trial-2"], "y")
    assert [round(y, 6) for y in ys] == [round(0.125 / s, 6) for s in range(1, 11)]
    assert not any(math.isnan(y) for y in ys)



def test_an_early_stop_rule_relative_to_the_sweep_stops_the_trial_behind_the_best(launcher):
    """`loss > 1.2x best for 5 steps -> stop`: one trial at a time, the second's loss is 3x the
    first's at every step, so it stops within a few steps; the third, 1.1x, runs to the end."""
    client = launcher.client
    script = launcher.script("scaled.py", """
        import time
        from jupyter_dlc import runtime

        runtime.init()
        scale = runtime.params(scale=1.0)["scale"]
        for step in range(1, 61):
            runtime.log(step, loss=scale / step)
            time.sleep(0.05)
        """)
    run = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "run", script, "--name", "halving",
                          "--sweep", "scale=1,3,1.1", "--parallel", "1",
                          "--alert", "loss > 1.2x best for 5 steps -> stop", "--wait"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr  # a stopped trial is no failure
    sweep_id = re.match(r"sweep (\S+): 3 trials", run.stdout).group(1)
    good, bad, close = sweeps.trials_of(client, sweep_id)
    assert good["state"] == "SUCCEEDED" and close["state"] == "SUCCEEDED"
    assert bad["state"] == "STOPPED", bad["reason"]
    stopping = [e["reason"] for e in client.events(bad["id"]) if e["type"] == "state" and e["state"] == "STOPPING"]
    assert stopping and stopping[0].startswith("alert: loss > 1.2x best for 5 steps: "), stopping
    assert "the sweep's best there" in stopping[0]
    assert bad["last_step"] < 40, bad["last_step"]  # stopped early, not at its end (60)
    fired = [e for e in client.events(bad["id"]) if e["type"] == "alert"]
    assert fired and fired[0]["data"]["detail"]["streak"] >= 5
    assert not [e for e in client.events(close["id"]) if e["type"] == "alert"]
    assert "STOPPED" in run.stdout  # the table at the end


def test_a_best_rule_outside_a_sweep_is_refused(launcher):
    script = launcher.script("one.py", "print(1)\n")
    with pytest.raises(LauncherError) as caught:
        launcher.client.submit({"script": script, "alerts": ["loss > 1.2x best for 5 steps -> stop"]})
    assert caught.value.status == 400
    assert str(caught.value).startswith("alerts: 'loss > 1.2x best for 5 steps -> stop': 'best' is the best")
