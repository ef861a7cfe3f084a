"""Branches (`--from JOB@STEP`) on real 1x2 torchrun jobs (DDP, gloo) under a real launcher.

One parent trains 20 steps with SGD and momentum, committing every 5 steps. Its branches run
edited code: another learning rate (in a real kernel, through `%%dlc --from`), a new head.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from test_notebook import run_notebook, text
from test_widgets import _column, saved_sources

from jupyter_dlc.client import LauncherError
from jupyter_dlc.export import export_job

TRAIN = """
import os
import torch, torch.nn as nn
from jupyter_dlc import runtime

info = runtime.init()
TOTAL, LR, HEAD, STRICT = {total}, {lr}, {head}, {strict}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.out = nn.Linear(8, 1)
        if HEAD:  # the edit a researcher makes: one more layer on top
            self.head = nn.Linear(1, 1)

    def forward(self, x):
        y = self.out(self.body(x))
        return self.head(y) if HEAD else y


torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(Net())
opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
ckpt = runtime.Checkpointer(model=model, optimizer=opt)
step = ckpt.restore(strict=STRICT)
if info.rank == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["DLC_JOB_DIR"], f"restored-{{info.attempt}}.pt"))
while step < TOTAL:
    g = torch.Generator().manual_seed(100 * step + info.rank)
    x = torch.randn(16, 4, generator=g)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    runtime.log(step, loss=loss.item(), lr=opt.param_groups[0]["lr"])
    if step % 5 == 0:
        ckpt.save(step)
ckpt.wait()
"""


def train(total=20, lr=0.05, head=False, strict=True) -> str:
    return TRAIN.format(total=total, lr=lr, head=head, strict=strict)


@pytest.fixture(scope="module")
def parent(shared_launcher):
    script = shared_launcher.script("parent.py", train())
    client = shared_launcher.client
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "keep_last": 10,
                         "name": "parent"})
    job = client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert [c["step"] for c in client.checkpoints(job["id"])] == [5, 10, 15, 20]
    return job


def saved_model(step_dir: str, rank: int = 0) -> dict:
    return torch.load(os.path.join(step_dir, f"rank-{rank}.pt"), weights_only=False)["model"]


def log_text(client, job_id: str, attempt: int | None = None) -> str:
    return "\n".join(line["text"] for line in client.logs(job_id, rank=0, attempt=attempt)["lines"])


def line_of(script: str, text: str) -> int:
    with open(script) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def series(client, job_id: str, name: str) -> dict[int, float]:
    return {p["step"]: p["value"] for p in client.metrics(job_id)["points"]
            if p["name"] == name and p["rank"] == 0}


def test_branch_from_an_older_step_in_a_cell_restores_it_bitwise_and_trains_with_the_new_rate(
        shared_launcher, parent, tmp_path):
    client = shared_launcher.client
    nb = run_notebook(["%load_ext jupyter_dlc",
                       f"%%dlc --nproc-per-node 2 --from {parent['id']}@10 --name lower-lr --wait\n"
                       + train(total=15, lr=0.01)], str(tmp_path))
    child = next(j for j in client.jobs() if j["name"] == "lower-lr")
    assert child["state"] == "SUCCEEDED", (child["reason"], text(nb.cells[1]))  # --wait waited
    # Its view draws the parent's curve up to step 10, muted, under its own from step 11.
    models = list(nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"].values())
    sources = saved_sources(models, "dlc-train-")
    assert _column(sources["dlc-train-parent"], "x") == list(range(1, 11))
    assert _column(sources["dlc-train-0"], "x") == list(range(11, 16))
    header = [m["state"]["value"] for m in models if "dlc-parent" in str(m["state"].get("value", ""))]
    assert header and f"branched from {parent['id']} at step 10" in header[-1]
    assert child["parent"] == {"job": parent["id"], "step": 10}

    # Its first attempt restored the parent's step 10, bit for bit, not the newest (20).
    step_10 = os.path.join(parent["job_dir"], "checkpoints", "step-10")
    restored = torch.load(os.path.join(child["job_dir"], "restored-1.pt"))
    expected = saved_model(step_10)
    assert restored.keys() == expected.keys()
    for key in expected:
        assert torch.equal(restored[key], expected[key]), key

    # It went on from step 11 with the code's learning rate, while the parent's was kept in
    # the checkpoint's optimizer state.
    lr = series(client, child["id"], "lr")
    assert min(lr) == 11 and max(lr) == 15
    assert set(lr.values()) == {0.01}
    assert set(series(client, parent["id"], "lr").values()) == {0.05}
    log = log_text(client, child["id"])
    assert "settings kept from your code, not the checkpoint: lr 0.05 -> 0.01" in log, log[-2000:]
    assert [c["step"] for c in client.checkpoints(child["id"])] == [10, 15]

    # The tree, as `jupyter-dlc list --tree` prints it: the branch under its parent.
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "list", "--tree"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(parent["id"]))
    assert lines[at + 1].startswith(f"└─ {child['id']} @10"), out

    # Its bundle reproduces it without the launcher: run.sh restores the same step and runs
    # the branch's code, with its learning rate.
    bundle = tmp_path / "bundle"
    export_job(client, child["id"], str(bundle))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLC_", "MASTER_"))}
    ran = subprocess.run(["./run.sh", "all"], cwd=bundle, env=env, capture_output=True, text=True,
                         timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "settings kept from your code, not the checkpoint: lr 0.05 -> 0.01" in ran.stdout + ran.stderr
    replayed = torch.load(bundle / "restored-1.pt")
    assert all(torch.equal(replayed[key], expected[key]) for key in expected)
    assert sorted(os.listdir(bundle / "checkpoints")) == ["step-15"]

    # The branch's step is its own: deleting the parent leaves it, and a resume takes it.
    client.delete(parent["id"])
    assert [c["step"] for c in client.checkpoints(child["id"])] == [10, 15]
    client.resume(child["id"], step=10)
    resumed = client.wait(child["id"], timeout=120)
    assert resumed["state"] == "SUCCEEDED", resumed["reason"]
    again = torch.load(os.path.join(child["job_dir"], "restored-2.pt"))
    assert all(torch.equal(again[key], expected[key]) for key in expected)
    assert "settings kept from your code" in log_text(client, child["id"], attempt=2)
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "list", "--tree"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"{child['id']} @10 (from {parent['id']}, deleted)" in out, out


@pytest.fixture(scope="module")
def parent_for_heads(shared_launcher):
    """A parent of its own: the test above deletes the first one at its end."""
    script = shared_launcher.script("parent2.py", train())
    job = shared_launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                         "keep_last": 10, "name": "parent2"})
    job = shared_launcher.client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    return job


def test_a_branch_that_adds_a_layer_is_told_the_keys_and_runs_with_strict_false(shared_launcher,
                                                                               parent_for_heads):
    client = shared_launcher.client
    parent = parent_for_heads
    common = {"nodes": 1, "nproc_per_node": 2, "max_restarts": 0, "branch_from": f"{parent['id']}@15"}
    head_py = shared_launcher.script("head.py", train(total=18, head=True))
    strict = client.submit(dict(common, script=head_py, name="head-strict"))
    loose = client.submit(dict(common, script=shared_launcher.script(
        "head_loose.py", train(total=18, head=True, strict=False)), name="head-loose"))
    fresh = client.submit(dict(common, script=shared_launcher.script(
        "head_fresh.py", train(total=18, head=True, strict=False)), name="head-fresh",
        fresh_optimizer=True))

    strict = client.wait(strict["id"], timeout=180)
    assert strict["state"] == "FAILED"
    found = client.diagnosis(strict["id"])[-1]
    assert found["class"] == "checkpoint_mismatch", found
    assert "CheckpointMismatch" in found["line"]
    assert "missing from the checkpoint module.head.weight, module.head.bias" in found["line"]
    assert "strict=False" in found["suggestion"] and "--fresh-optimizer" in found["suggestion"]
    assert found["where"] == f"{head_py}:{line_of(head_py, 'ckpt.restore(')}", found["where"]
    # The one screen: each key on a line of its own, no traceback of load_state_dict.
    log = log_text(client, strict["id"])
    assert "  missing from the checkpoint (new in your model), 2:\n    module.head.weight\n" \
           "    module.head.bias" in log, log[-3000:]
    assert "load_state_dict" not in log

    loose = client.wait(loose["id"], timeout=180)
    assert loose["state"] == "FAILED"
    assert "--fresh-optimizer" in client.diagnosis(loose["id"])[-1]["line"]

    fresh = client.wait(fresh["id"], timeout=180)
    assert fresh["state"] == "SUCCEEDED", fresh["reason"]
    restored = torch.load(os.path.join(fresh["job_dir"], "restored-1.pt"))
    saved = saved_model(os.path.join(parent["job_dir"], "checkpoints", "step-15"))
    assert set(restored) - set(saved) == {"module.head.weight", "module.head.bias"}
    assert all(torch.equal(restored[key], saved[key]) for key in saved)
    log = log_text(client, fresh["id"])
    assert "optimizer: not restored (--fresh-optimizer)" in log
    assert "model: restored with strict=False" in log
    assert min(series(client, fresh["id"], "loss")) == 16


def test_a_branch_that_cannot_be_is_refused_in_one_line_and_nothing_is_stored(shared_launcher,
                                                                            parent_for_heads):
    client = shared_launcher.client
    parent = parent_for_heads["id"]
    script = shared_launcher.script("refused.py", train())
    before = {j["id"] for j in client.jobs()}
    jobs_dir = os.path.join(shared_launcher.data_dir, "jobs")
    dirs_before = set(os.listdir(jobs_dir))

    def refusal(**fields) -> str:
        spec = dict({"script": script, "nodes": 1, "nproc_per_node": 2}, **fields)
        with pytest.raises(LauncherError) as caught:
            client.request("POST", "/api/jobs", spec)  # the launcher's own check, not the client's
        assert caught.value.status == 400, caught.value
        message = str(caught.value)
        assert "\n" not in message
        return message

    assert refusal(branch_from="no-such-job@5") == \
        "branch_from: no job 'no-such-job'; `jupyter-dlc list` shows the jobs"
    assert refusal(branch_from=f"{parent}@7") == \
        f"branch_from: step 7 of job {parent} is not a committed checkpoint; committed steps that verify: 5, 10, 15, 20"
    # A step of a job without DDP (each rank's own state) keeps its world size.
    plain = client.submit({"script": shared_launcher.script("plain.py", """
        import torch
        from jupyter_dlc import runtime
        runtime.init()
        ckpt = runtime.Checkpointer(model=torch.nn.Linear(2, 2))
        ckpt.restore()
        runtime.log(1, loss=1.0)
        ckpt.save(1)
        ckpt.wait()
        """), "nodes": 1, "nproc_per_node": 2})
    plain = client.wait(plain["id"], timeout=120)
    assert plain["state"] == "SUCCEEDED", plain["reason"]
    before.add(plain["id"])
    dirs_before.add(plain["id"])
    assert refusal(branch_from=f"{plain['id']}@1", nproc_per_node=1).startswith(
        f"branch_from: {plain['id']}@1 was saved by 2 ranks and this job has 1 (1x1); only a DDP job's step")
    assert refusal(fresh_optimizer=True).startswith("fresh_optimizer: only applies to a branch")
    own_dir = os.path.join(parent_for_heads["job_dir"], "checkpoints")
    assert refusal(branch_from=parent, checkpoint_dir=own_dir).startswith(
        f"checkpoint_dir: {own_dir} already holds committed steps")
    for hostile in (f"{parent}@5; rm -rf ~", f"{parent}\n@5", "../../etc@5", "@5", f"{parent}@-1",
                    f"{parent}@1e3", f"{parent}@5@6", "$(id)", "x" * 200, 5, ["a"]):
        assert refusal(branch_from=hostile).startswith("branch_from: expected JOB or JOB@STEP"), hostile
    assert {j["id"] for j in client.jobs()} == before
    assert set(os.listdir(jobs_dir)) == dirs_before
    # The newest committed step when no step is given.
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "branch_from": parent,
                         "name": "newest"})
    assert job["parent"] == {"job": parent, "step": 20}
    job = client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED" and job["last_step"] is None  # step 20 of 20: nothing left


def test_compare_shows_both_curves_the_fields_and_the_code_that_differ(shared_launcher, parent_for_heads,
                                                                        tmp_path):
    client = shared_launcher.client
    parent = parent_for_heads
    child = client.submit({"script": shared_launcher.script("lower.py", train(total=20, lr=0.01)),
                           "nodes": 1, "nproc_per_node": 2, "branch_from": f"{parent['id']}@10",
                           "env": {"NOTE": "lower lr"}, "name": "lower"})
    child = client.wait(child["id"], timeout=180)
    assert child["state"] == "SUCCEEDED", child["reason"]

    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "compare", parent["id"], child["id"]],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "STEPS", "LAST", "LOSS", "BEST", "LOSS", "WALL"]
    assert lines[1].split()[:3] == [parent["id"], "SUCCEEDED", "20"]
    assert lines[2].split()[:3] == [child["id"], "SUCCEEDED", "20"]
    differs = {line.split()[0]: line.split()[1:] for line in lines if line.startswith(("branch_from", "env."))}
    assert differs["branch_from"] == ["-", f"{parent['id']}@10"]
    assert differs["env.NOTE"] == ["-", "lower", "lr"]
    assert "-TOTAL, LR, HEAD, STRICT = 20, 0.05, False, True" in out
    assert "+TOTAL, LR, HEAD, STRICT = 20, 0.01, False, True" in out

    nb = run_notebook(["%load_ext jupyter_dlc", f"%dlc compare {parent['id']} {child['id']}"], str(tmp_path))
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = list(state.values())
    html_values = [m["state"].get("value", "") for m in models if m["model_name"] == "HTMLModel"]
    values = next(v for v in html_values if 'class="dlc-compare"' in v)
    assert re.findall(r'<tr class="dlc-compared" data-job="([^"]+)"', values) == [parent["id"], child["id"]]
    fields = next(v for v in html_values if 'class="dlc-differences"' in v)
    assert 'data-field="branch_from"' in fields and f"<td>{parent['id']}@10</td>" in fields
    assert 'data-field="env.NOTE"' in fields and "<td>lower lr</td>" in fields
    code = next(v for v in html_values if 'class="dlc-code-diff"' in v)
    assert "+TOTAL, LR, HEAD, STRICT = 20, 0.01, False, True" in code
    sources = saved_sources(models, "dlc-compare-")
    assert set(sources) == {f"dlc-compare-{axis}-{i}" for axis in ("step", "time") for i in (0, 1)}
    assert _column(sources["dlc-compare-step-0"], "x") == list(range(1, 21))
    assert _column(sources["dlc-compare-step-1"], "x") == list(range(11, 21))  # from the branch step on
    times = _column(sources["dlc-compare-time-1"], "x")
    assert times == sorted(times) and times[0] > 0


SAMPLED = """
import os
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from jupyter_dlc import runtime

info = runtime.init()
STOP_AT = {stop_at}
data = TensorDataset(torch.arange(160))
sampler = runtime.ResumableDistributedSampler(data, shuffle=True, seed=3)
loader = DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(1, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = runtime.Checkpointer(model=model, optimizer=opt, sampler=sampler)
step = ckpt.restore()
if info.rank == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["DLC_JOB_DIR"], "restored.pt"))
seen = open(os.path.join(os.environ["DLC_JOB_DIR"], f"seen-{{info.rank}}.txt"), "a")
sampler.set_epoch(0)
for (batch,) in loader:
    loss = model(batch.float().unsqueeze(1) / 160).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    seen.write(f"{{step}} {{' '.join(map(str, batch.tolist()))}}\\n")
    seen.flush()
    runtime.log(step, loss=loss.item())
    if step % 4 == 0:
        ckpt.save(step)
    if step == STOP_AT:
        break
ckpt.wait()
"""


def seen_samples(job_dir: str, ranks: int, up_to: int | None = None) -> list[int]:
    out = []
    for rank in range(ranks):
        with open(os.path.join(job_dir, f"seen-{rank}.txt")) as f:
            for line in f:
                step, *samples = line.split()
                if up_to is None or int(step) <= up_to:
                    out += map(int, samples)
    return out


def test_a_ddp_job_branched_to_fewer_ranks_goes_on_from_the_epochs_global_position(shared_launcher):
    """2x2 DDP takes 16 of 160 samples a step; branched at step 4 (64 taken) to 1x2, which
    takes 8 a step, the branch sees exactly the 96 the parent had not, each once."""
    client = shared_launcher.client
    parent = client.submit({"script": shared_launcher.script("sampled.py", SAMPLED.format(stop_at=8)),
                            "nodes": 2, "nproc_per_node": 2, "keep_last": 5, "name": "wide"})
    parent = client.wait(parent["id"], timeout=240)
    assert parent["state"] == "SUCCEEDED", parent["reason"]
    assert [c["step"] for c in client.checkpoints(parent["id"])] == [4, 8]
    narrow = client.submit({"script": shared_launcher.script("narrow.py", SAMPLED.format(stop_at=0)),
                            "nodes": 1, "nproc_per_node": 2, "branch_from": f"{parent['id']}@4",
                            "name": "narrow"})
    narrow = client.wait(narrow["id"], timeout=240)
    assert narrow["state"] == "SUCCEEDED", narrow["reason"]
    before = seen_samples(parent["job_dir"], 4, up_to=4)
    after = seen_samples(narrow["job_dir"], 2)
    assert len(before) == 64 and len(after) == 96
    assert sorted(before + after) == list(range(160))  # every sample of the epoch once
    lr = series(client, narrow["id"], "loss")
    assert min(lr) == 5 and max(lr) == 4 + 12  # 96 samples, 8 a step
    restored = torch.load(os.path.join(narrow["job_dir"], "restored.pt"))
    saved = saved_model(os.path.join(parent["job_dir"], "checkpoints", "step-4"))
    assert all(torch.equal(restored[key], saved[key]) for key in saved)
