"""Real torchrun, 2 nodes x 2 processes on 127.0.0.1 (static rendezvous, gloo): a run killed
after a checkpoint and resumed ends bitwise identical to an uninterrupted run; SIGTERM to
the agents checkpoints the same step on every rank and every rank exits 0.

The runtime alone, under plain torchrun as a user's script may run: reports go to the
recording stand-in of tests/test_runtime_report.py (see its docstring for why, and for the
end-to-end counterparts under the real launcher).
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import torch

from jupyter_dlc import layout
from test_runtime_report import JOB_ID, TOKEN, LauncherStub

TRAIN = """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    from jupyter_dlc import runtime

    info = runtime.init()
    total, kill_at = int(os.environ["TOTAL_STEPS"]), int(os.environ.get("KILL_AT", "0"))
    pause = float(os.environ.get("STEP_PAUSE", "0"))
    torch.manual_seed(1234)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = runtime.ResumableDistributedSampler(data, shuffle=True, seed=3)
    # Its own generator: otherwise every new epoch iterator draws a seed from the global
    # RNG, and a resumed run (which starts a fresh iterator mid-epoch) draws once more.
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler,
                                         generator=torch.Generator())
    # Gradients averaged per parameter, not by DDP: DDP reduces its first iteration in the
    # construction-time bucket layout and later ones in the rebuilt layout, so a resumed run's
    # first step sums in a different order and differs in the last bit (measured).
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    for parameter in model.parameters():
        dist.broadcast(parameter.data, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
    ckpt = runtime.Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler,
                                sampler=sampler)
    step = ckpt.restore()
    epoch = sampler.epoch
    try:
        while step < total:
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= info.world_size
                optimizer.step()
                scheduler.step()
                step += 1
                runtime.log(step, loss=loss.item())
                if step % 5 == 0:
                    ckpt.save(step)
                if step == kill_at and info.rank == 2:
                    ckpt.wait()
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(pause)
                if step == total:
                    break
            epoch += 1
        ckpt.wait()
        if info.rank == 0:
            torch.save(model.state_dict(), os.environ["FINAL_PATH"])
        code = 0
    except SystemExit as stop:
        code = stop.code
    with open(os.path.join(os.environ["OUT_DIR"], f"exit-{info.rank}"), "w") as f:
        f.write(str(code))
    runtime.shutdown()
    dist.destroy_process_group()  # then os._exit: gloo may crash at interpreter exit
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(tmp_path, name, launcher, **env):
    """Two torchrun agents (node 0 and node 1), each with 2 workers."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    out_dir = tmp_path / name
    out_dir.mkdir()
    port = free_port()
    agents = []
    for node in (0, 1):
        environment = dict(
            os.environ, OUT_DIR=str(out_dir), FINAL_PATH=str(out_dir / "final.pt"),
            DLC_CHECKPOINT_DIR=str(tmp_path / "ckpt"), DLC_JOB_ID=JOB_ID, DLC_TOKEN=TOKEN,
            DLC_LAUNCHER_URL=launcher.url, DLC_NODE_RANK=str(node), DLC_NNODES="2",
            DLC_HEARTBEAT_INTERVAL="1", **env)
        log = open(out_dir / f"node-{node}.log", "w")
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--max-restarts", "0", str(script)],
            env=environment, stdout=log, stderr=subprocess.STDOUT))
    return out_dir, agents


def finish(agents, out_dir, timeout=120):
    try:
        return [agent.wait(timeout) for agent in agents]
    except subprocess.TimeoutExpired:
        logs = "\n".join((out_dir / f"node-{n}.log").read_text()[-3000:] for n in (0, 1))
        raise AssertionError(f"torchrun did not finish:\n{logs}") from None
    finally:
        for agent in agents:
            agent.kill()


def exit_codes(out_dir):
    return {r: (out_dir / f"exit-{r}").read_text() for r in range(4)
            if (out_dir / f"exit-{r}").exists()}


def test_killed_and_resumed_run_matches_uninterrupted_run(tmp_path):
    launcher = LauncherStub()
    try:
        (tmp_path / "uninterrupted").mkdir()  # its own checkpoint directory
        full_dir, agents = start_job(tmp_path / "uninterrupted", "full", launcher,
                                     TOTAL_STEPS="30")
        killed_dir, killed_agents = start_job(tmp_path, "killed", launcher, TOTAL_STEPS="30",
                                              KILL_AT="17")
        finish(agents, full_dir)
        assert exit_codes(full_dir) == {r: "0" for r in range(4)}
        assert finish(killed_agents, killed_dir) != [0, 0]
        ckpt_dir = str(tmp_path / "ckpt")
        latest = layout.latest_committed(ckpt_dir)
        assert latest["step"] == 15 and latest["world_size"] == 4
        assert layout.verify_step(latest["path"], deep=True)

        resumed_dir, agents = start_job(tmp_path, "resumed", launcher, TOTAL_STEPS="30",
                                        DLC_RESUME_PATH=latest["path"])
        finish(agents, resumed_dir)
        assert exit_codes(resumed_dir) == {r: "0" for r in range(4)}
    finally:
        launcher.stop()
    full = torch.load(full_dir / "final.pt")
    resumed = torch.load(resumed_dir / "final.pt")
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name
    committed = [r["step"] for r in layout.committed_steps(ckpt_dir)]
    assert committed == [20, 25, 30]  # keep-last 3 after the resumed run
    resumed_steps = {m["step"] for m in launcher.entries("metrics") if m["step"] > 17}
    assert resumed_steps == set(range(18, 31))


def test_sigterm_checkpoints_same_step_everywhere_and_exits_zero(tmp_path):
    launcher = LauncherStub()
    try:
        out_dir, agents = start_job(tmp_path, "run", launcher, TOTAL_STEPS="100000",
                                    STEP_PAUSE="0.02")
        assert launcher.wait_for(
            lambda: {m["rank"] for m in launcher.entries("metrics") if m["step"] >= 8}
            == {0, 1, 2, 3}, timeout=90)
        for agent in agents:
            agent.send_signal(signal.SIGTERM)  # each agent forwards it to its workers
        finish(agents, out_dir, timeout=60)
        assert exit_codes(out_dir) == {r: "0" for r in range(4)}
        preempted = launcher.events("preempted")
        assert sorted(e["rank"] for e in preempted) == [0, 1, 2, 3]
        [stop_step] = {e["step"] for e in preempted}
        latest = layout.latest_committed(str(tmp_path / "ckpt"))
        assert latest["step"] == stop_step and latest["world_size"] == 4
        assert any(e["step"] == stop_step for e in launcher.events("checkpoint"))
    finally:
        launcher.stop()
