"""Export bundles: a 2-node x 2-process gloo DDP job, exported, moved, and run with run.sh.

The script comes from a real capture (definitions from a shell, a pushed dict of tensors),
so the bundle must carry files/ and point DLC_JOB_DIR at itself for the job to load at all.
Its final loss is compared with the same script run by a single torchrun agent with 4
processes in a launcher-like job directory: same world size, same ranks, same numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from jupyter_dlc.export import ExportError, export_bundle
from jupyter_dlc.magics.capture import capture
from jupyter_dlc.spec import JobSpec

DDP_CELL = """\
import os, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(make_model())
opt = torch.optim.SGD(model.parameters(), lr=LR)
xs, ys = DATA["x"][rank::world], DATA["y"][rank::world]
first = None
for step in range(STEPS):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(xs), ys)
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    first = mean.item() if first is None else first
if rank == 0:
    print(f"world_size={world} first_loss={first:.8f} final_loss={mean.item():.8f}")
    env = os.environ
    print(f"env DEMO_FLAG={env.get('DEMO_FLAG')} NCCL_IB_DISABLE={env.get('NCCL_IB_DISABLE')} "
          f"ckpt={env.get('DLC_CHECKPOINT_DIR')} node={env.get('DLC_NODE_RANK')} "
          f"job_dir={env.get('DLC_JOB_DIR')}")
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # multi-node gloo workers can crash in interpreter shutdown (FIELD-NOTES)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DLC_", "MASTER_", "NCCL_")) and k not in ("NODE_RANK", "DEMO_FLAG")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Capture the DDP cell from a notebook-like shell; return (spec, script, files)."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    shell.reset(new_session=True)
    for cell in [
        "import torch",
        "def make_model():\n    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),"
        " torch.nn.Linear(16, 1))",
        "LR = 0.05\nSTEPS = 30",
        "g = torch.Generator().manual_seed(3)\nX = torch.randn(64, 8, generator=g)\n"
        "DATA = {'x': X, 'y': X @ torch.arange(8.0).unsqueeze(1) / 8}",
    ]:
        assert shell.run_cell(cell, store_history=True).success
    stage = tmp_path_factory.mktemp("stage")
    cap = capture(DDP_CELL, shell, push=["DATA"], staging_dir=str(stage))
    shell.reset(new_session=True)
    assert cap.summary == ("captured torch from [1], make_model from [2], LR from [3], STEPS from [3]; "
                           "pushed DATA")
    spec = JobSpec.from_dict({"name": "ddp-demo", "code": DDP_CELL, "nodes": 2, "nproc_per_node": 2,
                              "env": {"DEMO_FLAG": "on"}, "network": "tcp", "files": cap.files,
                              "source": {"kind": "notebook", "path": "demo.ipynb"}})
    return spec, cap.script, cap.files


def loss_line(output: str) -> str:
    match = re.search(r"^world_size=\d+ first_loss=\S+ final_loss=\S+$", output, re.M)
    assert match, output
    return match.group(0)


@pytest.fixture(scope="module")
def direct_run(job, tmp_path_factory):
    """The same script through one plain torchrun agent, in a launcher-like job directory."""
    spec, script, files = job
    job_dir = tmp_path_factory.mktemp("jobdir")
    (job_dir / "script.py").write_text(script)
    (job_dir / "files").mkdir()
    for name, path in files.items():
        shutil.copy(path, job_dir / "files" / name)
    proc = subprocess.run(
        ["torchrun", "--nnodes", "1", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), str(job_dir / "script.py")],
        env=clean_env(DLC_JOB_DIR=str(job_dir)), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return loss_line(proc.stdout)


def exported(job, tmp_path, **kwargs):
    spec, script, files = job
    first = tmp_path / "first"
    written = export_bundle(spec, script, str(first), **kwargs)
    moved = tmp_path / "moved" / "bundle"
    moved.parent.mkdir()
    shutil.move(str(first), str(moved))  # the bundle must not depend on where it was written
    return moved, written


def test_run_all_matches_direct_torchrun(job, direct_run, tmp_path):
    bundle, _ = exported(job, tmp_path)
    proc = subprocess.run(["./run.sh", "all"], cwd=bundle, env=clean_env(), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = loss_line(proc.stdout)
    assert line == direct_run
    world, first, final = re.match(r"world_size=(\d+) first_loss=(\S+) final_loss=(\S+)", line).groups()
    assert world == "4" and float(final) < float(first) / 2  # it trained, on all four ranks
    assert (f"env DEMO_FLAG=on NCCL_IB_DISABLE=1 ckpt={bundle}/checkpoints node=0 job_dir={bundle}\n"
            in proc.stdout), proc.stdout
    assert (bundle / "checkpoints").is_dir()


def test_one_command_per_node_matches(job, direct_run, tmp_path):
    bundle, _ = exported(job, tmp_path)
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    node0 = subprocess.Popen([str(bundle / "run.sh"), "0"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    node1 = subprocess.Popen([str(bundle / "run.sh")], env=dict(env, NODE_RANK="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out0, _ = node0.communicate(timeout=240)
    out1, _ = node1.communicate(timeout=240)
    assert node0.returncode == 0 and node1.returncode == 0, out0 + out1
    assert loss_line(out0) == direct_run
    assert "final_loss" not in out1  # rank 0 lives on node 0


def test_failed_rank_ends_run_all_promptly(job, tmp_path):
    spec, script, files = job
    failing = script.replace('if rank == 0:\n    print(f"world_size',
                             'if rank == 3:\n    raise SystemExit(3)\nif rank == 0:\n    print(f"world_size')
    assert failing != script
    bundle = tmp_path / "bundle"
    export_bundle(spec, failing, str(bundle))
    try:  # waited for, with a bound far below the exit barrier a stuck node would sit in
        proc = subprocess.run([str(bundle / "run.sh"), "all"], env=clean_env(), capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a node waited in its exit barrier after another failed")
    assert proc.returncode != 0
    assert "a node failed" in proc.stderr


def test_bundle_layout_spec_and_refusals(job, tmp_path):
    spec, script, files = job
    bundle, written = exported(job, tmp_path, extra={"k8s/pytorchjob.yaml": "kind: PyTorchJob\n"})
    names = sorted(os.path.relpath(p, tmp_path / "first") for p in written)
    assert names == ["files/DATA.pt", "job.sbatch", "job.yaml", "k8s/00-persistentvolumeclaim.yaml",
                     "k8s/01-configmap.yaml", "k8s/02-service.yaml", "k8s/03-job.yaml",
                     "k8s/pytorchjob.yaml", "run.sh", "script.py"]
    assert (bundle / "script.py").read_text() == script
    assert os.access(bundle / "run.sh", os.X_OK)
    assert (bundle / "k8s" / "pytorchjob.yaml").read_text() == "kind: PyTorchJob\n"
    record = yaml.safe_load((bundle / "job.yaml").read_text())
    assert record["script"] == "script.py" and record["code"] is None
    assert record["files"] == {"DATA.pt": "files/DATA.pt"}
    assert (record["nodes"], record["nproc_per_node"], record["env"]) == (2, 2, {"DEMO_FLAG": "on"})
    assert record["source"] == {"kind": "notebook", "path": "demo.ipynb"}
    # The record is a valid spec again, from inside the bundle.
    cwd = os.getcwd()
    try:
        os.chdir(bundle)
        assert JobSpec.from_dict(record).world_size == 4
    finally:
        os.chdir(cwd)

    run_sh = (bundle / "run.sh").read_text()
    assert '[ -n "${NCCL_IB_DISABLE+set}" ] || NCCL_IB_DISABLE=1; export NCCL_IB_DISABLE' in run_sh
    assert '[ -n "${DEMO_FLAG+set}" ] || DEMO_FLAG=on; export DEMO_FLAG' in run_sh
    assert "DLC_TOKEN" not in run_sh and "DLC_LAUNCHER_URL" not in run_sh
    bad = subprocess.run([str(bundle / "run.sh"), "2"], env=clean_env(), capture_output=True, text=True)
    assert bad.returncode == 2 and "this job has 2 node(s): 0..1" in bad.stderr
    usage = subprocess.run([str(bundle / "run.sh")], env=clean_env(), capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: ./run.sh all" in usage.stderr

    with pytest.raises(ExportError, match="not empty"):
        export_bundle(spec, script, str(bundle))
    with pytest.raises(ExportError, match="extra: 'run.sh'"):
        export_bundle(spec, script, str(tmp_path / "x"), extra={"run.sh": ""})
    with pytest.raises(ExportError, match="does not exist"):
        export_bundle(spec, script, str(tmp_path / "y"), files={"DATA.pt": str(tmp_path / "gone.pt")})


def test_dict_spec_with_args_and_quoting(tmp_path):
    """A stored job (a dict whose staged files are gone), arguments with spaces and quotes."""
    script = "import sys, os\nprint(sys.argv[1:], os.environ['ODD'], os.environ['DLC_JOB_DIR'])\n"
    spec = {"name": "args", "script": "/nowhere/train.py", "args": ["a b", "it's", "$HOME"],
            "env": {"ODD": 'x "y" $z `w`'}, "files": {"gone.pkl": "/nowhere/gone.pkl"}}
    bundle = tmp_path / "bundle"
    export_bundle(spec, script, str(bundle), files={})
    # A stand-in for torchrun that runs the script once, so no torch is needed here.
    fake = tmp_path / "fake_torchrun.sh"
    fake.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift 2; done\nexec "$0.py" "$@"\n')
    fake.chmod(0o755)
    (tmp_path / "fake_torchrun.sh.py").write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                                                  "sys.argv = sys.argv[1:]\n"
                                                  "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    (tmp_path / "fake_torchrun.sh.py").chmod(0o755)
    proc = subprocess.run([str(bundle / "run.sh"), "0"], env=clean_env(TORCHRUN=str(fake)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"['a b', \"it's\", '$HOME'] x \"y\" $z `w` {bundle}\n"
