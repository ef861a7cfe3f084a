"""The magics in a real kernel (nbclient): the quickstart, capture, push, export, errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_notebook(cells: list[str], cwd: str, allow_errors: bool = False):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=allow_errors,
                            store_widget_state=True, resources={"metadata": {"path": cwd}})
    client.execute()
    return nb


def text(cell) -> str:
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
        elif "text/plain" in o.get("data", {}):
            out.append(o.data["text/plain"])
    return "".join(out)


def test_quickstart_notebook_runs_end_to_end(launcher):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "run_quickstart.py")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCEEDED" in result.stdout and "step 300, loss" in result.stdout
    assert "step-300" in result.stdout  # the checkpoints table
    job = launcher.client.job("last")
    assert job["name"] == "quickstart" and job["nodes"] == 2 and job["nproc_per_node"] == 2
    assert float(job["last_loss"]) < 0.5


def test_cell_uses_earlier_cells_and_a_pushed_tensor(launcher, tmp_path):
    cells = [
        "%load_ext jupyter_dlc",
        "import torch as th\nimport numpy as np",
        "def scale(v):\n    return v * FACTOR",
        "class Net(th.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.w = th.nn.Parameter(th.ones(3))\n    def forward(self, x):\n"
        "        return scale(self.w * x).sum()",
        "FACTOR = 2.0\nFACTOR = 3.0   # the last binding wins\nprint('side effect ran')",
        "data = th.arange(3, dtype=th.float32) + 1",
        "%%dlc --nodes 2 --nproc-per-node 2 --push data --name capture --wait\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "value = Net()(data)\n"
        "print('RESULT', dist.get_rank(), float(value), flush=True)",
        "print('KERNEL', float(Net()(data)))",
    ]
    nb = run_notebook(cells, str(tmp_path))
    summary = text(nb.cells[6])
    assert "captured" in summary and "Net from [4]" in summary and "pushed data" in summary
    kernel_value = float(text(nb.cells[7]).split()[1])
    job = launcher.client.job("last")
    assert job["state"] == "SUCCEEDED"
    lines = [x["text"] for x in launcher.client.logs(job["id"])["lines"] if x["text"].startswith("RESULT ")]
    assert len(lines) == 4
    assert all(float(line.split()[2]) == kernel_value for line in lines)
    assert not any("side effect ran" in x["text"] for x in launcher.client.logs(job["id"])["lines"])
    recorded = launcher.client.script(job["id"])
    assert "class Net" in recorded["script"] and "FACTOR = 3.0" in recorded["script"]
    assert recorded["files"]
    # The magic records where each script line came from (diagnoses point there): In[N] and
    # the line in that cell, counting the %%dlc line as line 1.
    from jupyter_dlc.launcher.source_origin import source_origin

    origin = source_origin(job["job_dir"])
    script_lines = recorded["script"].splitlines()
    assert origin.kind == "notebook"
    assert origin.cell_line(script_lines.index("value = Net()(data)") + 1) == (7, 4)
    assert origin.cell_line(script_lines.index("class Net(th.nn.Module):") + 1) == (4, 1)
    assert origin.cell_line(1) is None  # capture's own header line


def test_uncapturable_name_and_bad_arguments_are_one_line_refusals(launcher, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    cells = [
        "%load_ext jupyter_dlc",
        "handle = open('f.txt')",
        "%%dlc --nodes 2\nprint(handle.read())",
        "%%dlc --nodes two\nprint(1)",
        "%%dlc --network rdma:mlx5/0\nprint(1)",
        "%%dlc --env RANK=3\nprint(1)",
        "%dlc status no-such-job",
    ]
    nb = run_notebook(cells, str(tmp_path), allow_errors=True)
    for index, expected in ((2, "'handle'"), (3, "--nodes"), (4, "network"), (5, "RANK"),
                            (6, "no job 'no-such-job'")):
        out = text(nb.cells[index])
        assert "UsageError" in out and expected in out, out
        assert "Traceback" not in out
        assert len(out.strip().splitlines()) == 1, out
    assert "[2]" in text(nb.cells[2])  # the cell that bound it
    assert launcher.client.jobs() == []  # nothing started


def test_exported_bundle_runs_with_plain_torchrun_to_the_same_loss(launcher, tmp_path):
    script = launcher.script("train.py", """
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(20):
            x = torch.randn(16, 4, generator=g)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        loss = loss.detach(); dist.all_reduce(loss)
        if dist.get_rank() == 0:
            print(f"FINAL {loss.item():.8f}", flush=True)
        dist.destroy_process_group(); os._exit(0)
        """)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", (job["reason"], launcher.client.logs(job["id"], rank=0))
    final = [x["text"] for x in launcher.client.logs(job["id"], rank=0)["lines"] if "FINAL" in x["text"]]
    bundle = tmp_path / "bundle"
    cli = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "export", job["id"], str(bundle)],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    moved = tmp_path / "elsewhere"
    shutil.move(str(bundle), str(moved))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLC_")}
    run = subprocess.run(["bash", str(moved / "run.sh"), "all"], capture_output=True, text=True,
                         env=env, timeout=180, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert final and final[0] in run.stdout + run.stderr


@pytest.mark.parametrize("line", ["%dlc", "%dlc frobnicate"])
def test_unknown_line_magic_usage(launcher, tmp_path, line):
    nb = run_notebook(["%load_ext jupyter_dlc", line], str(tmp_path), allow_errors=True)
    out = text(nb.cells[1])
    assert "UsageError" in out and "Traceback" not in out
