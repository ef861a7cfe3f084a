"""Fault injection on real 2x2 torchrun jobs under the supervising launcher.

The training script is deterministic (seeded data, ResumableDistributedSampler, gloo on
CPU), so a job that is killed and resumed must end with exactly the parameters of a job
that never failed.
"""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch

from conftest import wait_for
from jupyter_dlc import formatting, layout
from jupyter_dlc.client import LauncherError

DATA = """
g = torch.Generator().manual_seed(0)
x = torch.randn(2048, 8, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1, generator=g))
sampler = runtime.ResumableDistributedSampler(data, shuffle=True, seed=1)
# A DataLoader draws a seed from the global RNG each time it is iterated; a resumed run
# iterates once more than a clean one, so give it a generator of its own.
loader = DataLoader(data, batch_size=16, sampler=sampler, generator=torch.Generator())
torch.manual_seed(0)
"""
# Adam on `model`, everything checkpointed, restored, then the epochs from where it left off.
RESUMED_LOOP = """opt = torch.optim.Adam(model.parameters(), lr=1e-2)
ckpt = runtime.Checkpointer(model=model, optimizer=opt, sampler=sampler)
step = ckpt.restore()
epoch = sampler.epoch
while step < total:
    sampler.set_epoch(epoch)
    for xb, yb in loader:
"""

TRAIN = """
import os, sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from jupyter_dlc import runtime

total = int(sys.argv[1])
pause = float(sys.argv[2])
info = runtime.init()
""" + DATA + """# Gradients are averaged here by hand, one parameter at a time; the same loop under DDP is
# TRAIN_DDP below (the Checkpointer carries DDP's bucket layout, runtime/ddp_layout.py).
import torch.distributed as dist
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
for p in model.parameters():
    dist.broadcast(p.data, 0)
""" + RESUMED_LOOP + """        noise = torch.randn(xb.shape) * 1e-3          # exercises the torch RNG state
        loss = nn.functional.mse_loss(model(xb + noise), yb)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        step += 1
        runtime.log(step, loss=loss.item())
        if step % 10 == 0:
            ckpt.save(step)
        time.sleep(pause)
        if step >= total:
            break
    epoch += 1
ckpt.wait()
if info.rank == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["DLC_JOB_DIR"], "final.pt"))
"""


def final_params(job) -> dict:
    return torch.load(os.path.join(job["job_dir"], "final.pt"))


def committed_beyond(client, job_id, step):
    return any(c["step"] > step for c in client.checkpoints(job_id))


@pytest.mark.slow
def test_three_kill_9s_end_bitwise_identical(launcher):
    script = launcher.script("train.py", TRAIN)
    total = 120
    clean = launcher.client.submit({"script": script, "args": [str(total), "0"], "nodes": 2,
                                    "nproc_per_node": 2, "name": "clean"})
    faulty = launcher.client.submit({"script": script, "args": [str(total), "0.05"], "nodes": 2,
                                     "nproc_per_node": 2, "name": "faulty", "max_restarts": 3,
                                     "heartbeat_interval": 1})
    rng = random.Random(7)
    client = launcher.client
    for kill in range(3):
        attempt = kill + 1
        wait_for(lambda attempt=attempt: client.job(faulty["id"])["attempt"] == attempt and
                 client.job(faulty["id"])["state"] == "RUNNING", 120, what=f"attempt {attempt}")
        base = client.job(faulty["id"])["last_step"] or 0
        target = base + rng.randint(3, 12)
        wait_for(lambda target=target: (client.job(faulty["id"])["last_step"] or 0) >= target and
                 committed_beyond(client, faulty["id"], 0), 120, what=f"step {target}")
        ranks = [r for r in client.job(faulty["id"])["ranks"] if r["pid"]]
        victim = rng.choice(ranks)
        os.kill(victim["pid"], signal.SIGKILL)
    clean = client.wait(clean["id"], timeout=300)
    faulty = client.wait(faulty["id"], timeout=300)
    assert clean["state"] == "SUCCEEDED", clean["reason"]
    assert faulty["state"] == "SUCCEEDED", faulty["reason"]
    assert faulty["attempt"] == 4
    outcomes = [a["outcome"] for a in client.job(faulty["id"])["attempts"]]
    assert outcomes == ["failed", "failed", "failed", "succeeded"]
    for attempt in client.job(faulty["id"])["attempts"][1:]:
        assert attempt["resume_path"] and os.path.basename(attempt["resume_path"]).startswith("step-")
    a, b = final_params(clean), final_params(faulty)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bitwise, not approximately
    assert launcher.own_processes() == []


def test_sigterm_preempts_with_a_checkpoint_and_resume_continues(launcher):
    script = launcher.script("train.py", TRAIN)
    client = launcher.client
    job = client.submit({"script": script, "args": ["400", "0.05"], "nodes": 1, "nproc_per_node": 2,
                         "heartbeat_interval": 1})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 13, 120, what="step 13")
    client.stop(job["id"], grace=30)
    stopped = client.wait(job["id"], timeout=60)
    assert stopped["state"] == "STOPPED"
    assert "checkpoint committed" in stopped["reason"]
    steps = [c["step"] for c in client.checkpoints(job["id"])]
    last = stopped["last_step"]
    assert steps and steps[-1] == last  # saved at the step boundary it stopped on
    assert any(e["type"] == "preempted" for e in client.events(job["id"]))
    client.resume(job["id"])
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", 60, what="resumed attempt")
    attempt = client.job(job["id"])["attempts"][-1]
    assert attempt["resume_path"].endswith(f"step-{last}")
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) > last, 60, what="progress after resume")
    client.stop(job["id"], grace=5)
    client.wait(job["id"], timeout=60)


def test_sigstop_is_detected_and_restarted(launcher):
    script = launcher.script("train.py", TRAIN)
    client = launcher.client
    job = client.submit({"script": script, "args": ["60", "0.1"], "nodes": 1, "nproc_per_node": 2,
                         "heartbeat_interval": 1, "heartbeat_misses": 3, "progress_timeout": "10s",
                         "max_restarts": 1})
    wait_for(lambda: (client.job(job["id"])["last_step"] or 0) >= 12, 120, what="step 12")
    victim = client.job(job["id"])["ranks"][1]
    os.kill(victim["pid"], signal.SIGSTOP)
    # Detected and restarted: waited for (the verdict itself is the reason checked below).
    wait_for(lambda: client.job(job["id"])["attempt"] == 2, 30, what="restart after SIGSTOP")
    reasons = [e["reason"] for e in client.events(job["id"]) if e["type"] == "state"]
    assert any("missed 3 heartbeats" in r or "no step progress" in r for r in reasons), reasons
    final = client.wait(job["id"], timeout=120)
    assert final["state"] == "SUCCEEDED", final["reason"]
    assert launcher.own_processes() == []


def test_same_failure_at_the_same_step_stops_retrying(launcher):
    script = launcher.script("bug.py", """
        from jupyter_dlc import runtime
        info = runtime.init()
        for step in range(1, 10):
            runtime.log(step, loss=1.0)
            if step == 5 and info.rank == 1:
                raise ValueError("shape mismatch in my_layer")
        """)
    job = launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                  "max_restarts": 5})
    job = launcher.client.wait(job["id"], timeout=120)
    assert job["state"] == "FAILED"
    assert job["attempt"] == 2  # one retry, then the repeat is recognised
    assert "deterministic" in job["reason"]
    diagnosis = launcher.client.diagnosis(job["id"])
    assert diagnosis[-1]["class"] == "user_exception" and diagnosis[-1]["rank"] == 1


def test_kill_during_persist_never_resumes_from_the_partial_step(launcher, tmp_path):
    """kill -9 of rank 0 (the rank that commits) while a step is being persisted: the partial
    step must not become DLC_RESUME_PATH, and the job still succeeds from the step before.

    The persist is held open on purpose, not caught by luck: in the first attempt rank 1's
    write of step 10 waits at a gate file, so rank 0 sits in its commit, waiting for rank 1's
    part, when it is killed; step 10 can never be committed."""
    gate = tmp_path / "gate"
    gate.touch()
    script = launcher.script("big.py", """
        import os, sys, time
        import torch, torch.nn as nn
        from jupyter_dlc import runtime
        from jupyter_dlc.runtime import persist
        info = runtime.init()
        gate = os.environ["GATE"]
        if info.rank == 1 and info.attempt == 1:
            write = persist.write_rank_file
            def held(step_path, *args, **kwargs):
                if step_path.endswith("step-10"):
                    open(gate + ".holding", "w").close()
                    while os.path.exists(gate):
                        time.sleep(0.02)
                return write(step_path, *args, **kwargs)
            persist.write_rank_file = held
        torch.manual_seed(0)
        model = nn.Linear(512, 512)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        ckpt = runtime.Checkpointer(model=model, optimizer=opt)
        step = ckpt.restore()
        while step < 30:
            loss = model(torch.randn(4, 512)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            step += 1
            runtime.log(step, loss=loss.item())
            if step % 5 == 0:
                ckpt.save(step)
        """)
    client = launcher.client
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2, "max_restarts": 2,
                         "keep_last": 10, "env": {"GATE": str(gate)}})
    partial = os.path.join(job["job_dir"], "checkpoints", "step-10")
    wait_for(lambda: os.path.exists(f"{gate}.holding") and
             os.path.exists(os.path.join(partial, "rank-0.pt.json")), 120, what="step 10 half written")
    rank0 = next(r for r in client.job(job["id"])["ranks"] if r["rank"] == 0)
    os.kill(rank0["pid"], signal.SIGKILL)
    from jupyter_dlc import layout

    assert not layout.verify_step(partial)  # rank 1's part is still held at the gate
    gate.unlink()

    final = client.wait(job["id"], timeout=180)
    assert final["state"] == "SUCCEEDED", final["reason"]
    second = final["attempts"][1]
    assert second["resume_path"] and second["resume_path"].endswith("step-5"), (partial, second)
    assert layout.verify_step(second["resume_path"], deep=True)
    assert launcher.own_processes() == []


# The same loop with DistributedDataParallel doing the all-reduce, Dropout drawing from the
# RNG, and Adam: the script knows nothing of buckets; the Checkpointer carries DDP's rebuilt
# bucket layout across the restart. Rank 1 of the first attempt kills itself with SIGKILL
# at step KILL_AT, which is not a checkpoint step, once the step before it committed (as a
# failure minutes into training finds it): a deterministic place, whatever the load. Without
# the wait, a loaded machine can still be writing step 10 when rank 1 dies, and the restart
# then rightly starts from scratch.
TRAIN_DDP = """
import os, signal, sys
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from jupyter_dlc import runtime

total, kill_at = int(sys.argv[1]), int(sys.argv[2])
info = runtime.init()
""" + DATA + """net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64), nn.Tanh(),
                    nn.Dropout(0.1), nn.Linear(64, 1))
model = WRAP
""" + RESUMED_LOOP + """        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        runtime.log(step, loss=loss.item())
        if step == kill_at and info.attempt == 1 and info.rank == 1:
            ckpt.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        if step % 10 == 0:
            ckpt.save(step)
        if step >= total:
            break
    epoch += 1
ckpt.wait()
final = FINAL
if info.rank == 0:
    torch.save(final, os.path.join(os.environ["DLC_JOB_DIR"], "final.pt"))
"""
DDP_RUN = TRAIN_DDP.replace("WRAP", "DDP(net)").replace("FINAL", "net.state_dict()")
# FSDP2 on CPU/gloo: every Linear and the root sharded; the Checkpointer saves each rank's
# shards (runtime/sharded_state.py); the final parameters are gathered whole on every rank.
FSDP_RUN = TRAIN_DDP.replace("WRAP", """net
from torch.distributed.fsdp import fully_shard
for layer in net:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(net)""").replace("FINAL", """None
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
final = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))""")


def _run_pair(launcher, name, body, total, kill_at):
    """A clean run and a run whose rank 1 dies by SIGKILL at `kill_at`, both 2 nodes x 2."""
    script = launcher.script(name, body)
    client = launcher.client
    clean = client.submit({"script": script, "args": [str(total), "0"], "nodes": 2,
                           "nproc_per_node": 2, "name": "clean"})
    faulty = client.submit({"script": script, "args": [str(total), str(kill_at)], "nodes": 2,
                            "nproc_per_node": 2, "name": "faulty", "max_restarts": 1})
    clean = client.wait(clean["id"], timeout=300)
    faulty = client.wait(faulty["id"], timeout=300)
    assert clean["state"] == "SUCCEEDED", clean["reason"]
    assert faulty["state"] == "SUCCEEDED", faulty["reason"]
    attempts = client.job(faulty["id"])["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[1]["resume_path"].endswith(f"step-{kill_at // 10 * 10}")
    return final_params(clean), final_params(faulty), faulty


def test_ddp_with_dropout_and_adam_resumes_bitwise(launcher):
    a, b, faulty = _run_pair(launcher, "ddp.py", DDP_RUN, 30, 15)
    resumed_from = launcher.client.job(faulty["id"])["attempts"][1]["resume_path"]
    saved = torch.load(os.path.join(resumed_from, "rank-0.pt"), weights_only=False)
    assert saved["ddp_bucket_layout"]["model"], "the checkpoint carries DDP's rebuilt layout"
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bitwise, not approximately
    assert launcher.own_processes() == []


# The same DDP run, but rank 1 of attempt 1 dies only once both nodes' standby agents for
# attempt 2 are warm (node-K.go.ready), as they are for a failure minutes into training; each
# rank of attempt 2 records where it came from.
WARM_RUN = DDP_RUN.replace("""        if step == kill_at and info.attempt == 1 and info.rank == 1:
""", """        if step == kill_at and info.attempt == 1 and info.rank == 1:
            import glob, time
            ready = os.path.join(os.environ["DLC_JOB_DIR"], "attempt-2", "node-*.go.ready")
            while len(glob.glob(ready)) < 2:
                time.sleep(0.05)
""").replace("""info = runtime.init()
""", """info = runtime.init()
import json
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().split(b"\\0")[0:6]
with open(os.path.join(os.environ["DLC_JOB_DIR"], f"origin-{info.attempt}-{info.rank}.json"), "w") as f:
    json.dump({"ppid": os.getppid(), "argv": [a.decode() for a in cmdline],
               "node": int(os.environ["GROUP_RANK"]), "threads": torch.get_num_threads(),
               "omp": os.environ.get("OMP_NUM_THREADS"), "token": bool(os.environ["DLC_TOKEN"]),
               "resume": os.environ["DLC_RESUME_PATH"], "attempt_env": os.environ["DLC_ATTEMPT"]}, f)
""")


def test_restart_on_warm_ranks_forked_by_the_standby_resumes_bitwise(launcher):
    """kill -9 once the standbys are warm: attempt 2's ranks are children forked by each
    node's standby agent (no new interpreter), with the worker environment torchrun gives,
    and the run still ends bitwise equal to a clean one."""
    a, b, faulty = _run_pair(launcher, "warm.py", WARM_RUN, 30, 15)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    job_dir = faulty["job_dir"]
    attempt_dir = os.path.join(job_dir, "attempt-2")
    import json

    for rank in range(4):
        with open(os.path.join(job_dir, f"origin-2-{rank}.json")) as f:
            origin = json.load(f)
        with open(os.path.join(attempt_dir, f"node-{origin['node']}.go.pid")) as f:
            standby = int(f.read())
        with open(os.path.join(attempt_dir, f"node-{origin['node']}.go.ready")) as f:
            assert f.read() == "2"  # both local ranks were forked ahead
        assert origin["ppid"] == standby, origin
        assert "jupyter_dlc.node.standby" in origin["argv"], origin
        assert origin["omp"] == "1" and origin["threads"] == 1, origin
        assert origin["token"] and origin["attempt_env"] == "2"
        assert origin["resume"].endswith("step-10")
        with open(os.path.join(attempt_dir, f"rank-{rank}.log")) as f:
            assert "restoring step-10 from this node's shared-memory copy" in f.read()
    with open(os.path.join(job_dir, "origin-1-0.json")) as f:
        cold = json.load(f)  # attempt 1 started cold: forked by its node's agent, no standby
    assert "jupyter_dlc.node.standby" in cold["argv"] and "--cold" in cold["argv"], cold
    assert not os.path.exists(os.path.join(job_dir, "attempt-1", "node-0.go.pid"))
    assert launcher.own_processes() == []
    wait_for(lambda: not os.path.exists(layout.node_copy_dir(job_dir)), 10, what="copy removed")


# Before rank 1 of attempt 1 dies, rank 1 flips a byte of its shared-memory copy of step 10
# and rank 2 makes its copy name another step; a barrier makes sure both are done.
SPOILED_RUN = DDP_RUN.replace("""        if step == kill_at and info.attempt == 1 and info.rank == 1:
            ckpt.wait()
            os.kill(os.getpid(), signal.SIGKILL)
""", """        if step == kill_at and info.attempt == 1:
            import json
            from jupyter_dlc import layout
            ckpt.wait()  # this rank's copy of step 10 is in place
            copy = layout.node_copy_dir(os.environ["DLC_JOB_DIR"])
            if info.rank == 1:
                path = os.path.join(copy, "rank-1.pt")
                raw = bytearray(open(path, "rb").read())
                raw[len(raw) // 2] ^= 0xFF
                open(path, "wb").write(bytes(raw))
            if info.rank == 2:
                path = os.path.join(copy, "rank-2.pt.json")
                meta = json.load(open(path))
                meta["step_path"] = meta["step_path"].replace("step-10", "step-0")
                json.dump(meta, open(path, "w"))
            torch.distributed.barrier()
            if info.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
""")


def test_corrupted_and_stale_shared_memory_copies_are_read_from_disk(launcher):
    """After kill -9, ranks whose node copy is intact restore from it, the corrupted and the
    stale one from the checkpoint directory, and the run still ends bitwise equal."""
    assert SPOILED_RUN != DDP_RUN
    a, b, faulty = _run_pair(launcher, "spoiled.py", SPOILED_RUN, 30, 15)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    logs = {}
    for rank in range(4):
        with open(os.path.join(faulty["job_dir"], "attempt-2", f"rank-{rank}.log")) as f:
            logs[rank] = [line for line in f if "restoring step-10" in line]
    assert "from this node's shared-memory copy" in logs[0][0], logs
    assert "from this node's shared-memory copy" in logs[3][0], logs
    assert "from disk: the shared-memory copy does not match the manifest (corrupted)" in logs[1][0]
    assert "from disk: the shared-memory copy is of step 10, not this one" in logs[2][0]
    wait_for(lambda: not os.path.exists(layout.node_copy_dir(faulty["job_dir"])), 10,
             what="copy removed")


def test_shared_memory_copies_survive_a_launcher_kill_and_go_with_the_job(launcher):
    """A running job's node copy outlives a kill -9 of the launcher (its ranks restore from
    it); the new launcher removes it when the job is stopped, and sweeps copies of jobs it
    no longer has, never another launcher's."""
    script = launcher.script("train.py", TRAIN)
    client = launcher.client
    job = client.submit({"script": script, "args": ["400", "0.05"], "nodes": 1, "nproc_per_node": 2})
    copy = layout.node_copy_dir(job["job_dir"])
    wait_for(lambda: all(os.path.exists(os.path.join(copy, f"rank-{r}.pt.json")) for r in (0, 1)),
             120, what="both ranks' copies")
    launcher.restart(kill=True)
    client = launcher.client
    ours = layout.make_node_copy_dir(os.path.join(launcher.data_dir, "jobs", "deleted-abc123"))
    theirs = layout.make_node_copy_dir(os.path.join(launcher.root, "other", "jobs", "x-abc123"))
    try:
        wait_for(lambda: not os.path.exists(ours), 10, what="the deleted job's copy swept")
        assert os.path.exists(theirs) and os.path.exists(os.path.join(copy, "rank-0.pt"))
        client.stop(job["id"], grace=0)
        assert client.wait(job["id"], timeout=60)["state"] == "STOPPED"
        wait_for(lambda: not os.path.exists(copy), 10, what="the stopped job's copy removed")
    finally:
        layout.discard_node_copy(theirs)
    assert launcher.own_processes() == []


def test_fsdp2_with_dropout_and_adam_resumes_bitwise(launcher):
    a, b, _ = _run_pair(launcher, "fsdp.py", FSDP_RUN, 30, 15)
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert launcher.own_processes() == []



STALLS = """
import os, time
import torch.distributed as dist
from jupyter_dlc import runtime
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 10_000):
    if rank == 1 and step == 4:
        time.sleep(3600)  # a stuck data loader: heartbeats go on, steps do not
    dist.barrier()
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.05)
"""


def test_a_hang_is_diagnosed_from_the_stacks_the_ranks_send(launcher):
    """Rank 1 stops before step 4; rank 0 waits for it in the barrier. Both still heartbeat
    (their reporter threads live) and both last logged step 3, so only the progress verdict
    catches it, and only the stacks the ranks send when asked tell which rank holds the other
    up and where: `why` must name rank 1 and the sleeping line, not the barrier."""
    script = launcher.script("stalls.py", STALLS)
    client = launcher.client
    job = client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                         "heartbeat_interval": 1, "progress_timeout": "5s", "max_restarts": 0})
    final = client.wait(job["id"], timeout=120)
    assert final["state"] == "FAILED", final["reason"]
    assert "all at step 3" in final["reason"], final["reason"]
    stacks = [e for e in client.events(job["id"]) if e["type"] == "stacks"]
    assert sorted(e["data"]["rank"] for e in stacks) == [0, 1]
    diagnosis = client.diagnosis(job["id"])[-1]
    assert diagnosis["class"] == "hang" and diagnosis["rank"] == 1, diagnosis
    assert diagnosis["where"].endswith(".py:9"), diagnosis  # the sleeping line
    assert any("time.sleep(3600)" in line for line in diagnosis["context"]), diagnosis
    assert "rank 0 at " in diagnosis["suggestion"] and ".py:10" in diagnosis["suggestion"], diagnosis
    text = formatting.diagnosis_text(client.diagnosis(job["id"]), client.job(job["id"]))
    assert "hang (rank 1 on node 0)" in text and ".py:9" in text, text


def test_the_progress_verdict_names_only_a_rank_that_is_behind():
    from jupyter_dlc.launcher.judging import _hang_reason

    def rank(r, step):
        return {"rank": r, "last_step": step, "last_progress": 100.0 + r}

    level = {0: rank(0, 7), 1: rank(1, 7), 2: rank(2, 7)}
    assert _hang_reason(level, 30) == ("no step progress on any rank for 30s (all at step 7): a hang", [])
    behind = {0: rank(0, 9), 1: rank(1, 3), 2: rank(2, 9)}
    reason, laggards = _hang_reason(behind, 30)
    assert laggards == [1] and "rank 1 stuck at step 3, the others at step 9" in reason


def _flip_a_tensor_byte(path: str) -> None:
    """Flip one byte inside a tensor's stored data (not the zip's structure, which torch.load
    would refuse): the file keeps its size, and loads silently with one value changed."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def test_a_flipped_byte_in_a_committed_step_is_skipped_and_the_newest_verifying_step_used(launcher):
    """Issue 26 item 8: one byte flipped in the newest step's rank-1.pt (same size) was listed,
    restored and trained on. Now rank 1 checks its file's sha256 against the manifest, reports
    the file and fails; the launcher restarts from the step before (no restart of
    --max-restarts 0 spent), `checkpoints` marks the step corrupt and the one used verified,
    and `resume --step` refuses the corrupt one."""
    # Attempt 3 (from the step before the corrupt one) takes 2 s a step, so that it cannot
    # commit a step of the corrupt one's number again before the final stop (seen under load
    # with 0.05 s steps): a step written again is a new manifest, judged afresh.
    slow_third = TRAIN.replace("info = runtime.init()\n",
                               "info = runtime.init()\npause = pause if info.attempt < 3 else 2.0\n")
    assert slow_third != TRAIN
    script = launcher.script("train.py", slow_third)
    client = launcher.client
    job = client.submit({"script": script, "args": ["400", "0.05"], "nodes": 1, "nproc_per_node": 2,
                         "heartbeat_interval": 1, "keep_last": 10, "max_restarts": 0})
    wait_for(lambda: committed_beyond(client, job["id"], 20), 120, what="step 30 committed")
    client.stop(job["id"], grace=30)  # saves at the step boundary it stops on
    assert client.wait(job["id"], timeout=60)["state"] == "STOPPED"
    listed = client.checkpoints(job["id"])
    newest, before = listed[-1], listed[-2]
    assert newest["verification"] == "unverified"  # sizes match: nobody hashed it since
    victim = os.path.join(newest["path"], layout.rank_file_name(1))
    size = os.path.getsize(victim)
    _flip_a_tensor_byte(victim)
    assert os.path.getsize(victim) == size and layout.verify_step(newest["path"])  # still "committed"
    assert [c["step"] for c in client.checkpoints(job["id"])] == [c["step"] for c in listed]

    client.resume(job["id"])

    def reported_or_trained_on():
        if any(e["type"] == "checkpoint_corrupt" for e in client.events(job["id"])):
            return "reported"
        detail = client.job(job["id"])
        if detail["attempt"] == 2 and all((r["last_step"] or 0) > newest["step"] for r in detail["ranks"]):
            return "trained on"  # what happened before: restored silently
        return None

    assert wait_for(reported_or_trained_on, 120, what="attempt 2's restore") == "reported"
    wait_for(lambda: client.job(job["id"])["attempt"] == 3 and client.job(job["id"])["state"] == "RUNNING",
             120, what="attempt 3 running")
    [corrupt] = [e for e in client.events(job["id"]) if e["type"] == "checkpoint_corrupt"]
    where = f"{os.path.basename(newest['path'])}/rank-1.pt"
    assert corrupt["attempt"] == 2 and corrupt["data"]["file"] == victim and corrupt["data"]["rank"] == 1
    assert corrupt["reason"].startswith(f"rank 1: checkpoint {where} does not match its manifest: sha256 ")
    attempts = client.job(job["id"])["attempts"]
    assert attempts[1]["resume_path"] == newest["path"] and attempts[1]["outcome"] == "failed"
    [restarting] = [e["reason"] for e in client.events(job["id"])
                    if e["type"] == "state" and e["state"] == "RESTARTING" and e["attempt"] == 2]
    assert restarting.endswith(f"{where} failed verification: restarting from "
                               f"{os.path.basename(before['path'])}"), restarting
    assert attempts[2]["resume_path"] == before["path"] and attempts[2]["restarts"] == 0
    assert attempts[2]["checkpoint_dir"] == os.path.dirname(newest["path"])

    # Every rank of attempt 3 went past the step it restored: each had checked its file.
    wait_for(lambda: all((r["last_step"] or 0) > before["step"] for r in client.job(job["id"])["ranks"]),
             60, what="attempt 3 past its resume step")
    marks = {c["step"]: c for c in client.checkpoints(job["id"])}
    assert marks[newest["step"]]["verification"] == "corrupt"
    assert marks[newest["step"]]["corrupt"][0]["file"] == victim
    assert marks[before["step"]]["verification"] == "verified"
    table = formatting.checkpoints_table(client.checkpoints(job["id"]))
    assert "CORRUPT (rank-1.pt)" in table and "verified" in table, table
    with open(os.path.join(job["job_dir"], "attempt-3", "rank-1.log")) as f:
        assert f"{os.path.basename(before['path'])}/rank-1.pt matches its manifest's sha256" in f.read()

    client.stop(job["id"], grace=5)
    client.wait(job["id"], timeout=60)
    assert {c["step"]: c for c in client.checkpoints(job["id"])}[newest["step"]]["time"] == newest["time"]
    try:
        client.resume(job["id"], step=newest["step"])
    except LauncherError as error:
        assert error.status == 400 and f"step: {newest['step']} failed verification ({victim}: sha256" \
            in str(error), str(error)
    else:
        raise AssertionError("a corrupt step was accepted for resume")
