"""Warm rank processes forked by a standby agent (node/warm_ranks.py), without torchrun:
the child runs the bootstrap with exactly the environment it is handed, its exit reaches the
agent as Popen's would, a death by signal is written into its rank record by the agent, and
an unused one leaves when its pipe closes. The agent is a real interpreter of its own (the
forks must not come from the pytest process); the job-level test is in test_recovery.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

AGENT = textwrap.dedent("""
    import json, os, sys, time
    from jupyter_dlc.node import warm_ranks
    attempt_dir, script = sys.argv[1], sys.argv[2]
    warm_ranks.preload()
    ranks = warm_ranks.fork_ranks(3)
    base = {"PATH": os.environ["PATH"], "DLC_ATTEMPT_DIR": attempt_dir, "OMP_NUM_THREADS": "1"}
    ok = ranks[0].hand([script, "ok"], dict(base, RANK="0", ONLY_HERE="x"), None, None)
    dead = ranks[1].hand([script, "die"], dict(base, RANK="1"), None, None)
    os.close(ranks[2].order_fd)  # never needed
    _, unused = os.waitpid(ranks[2].pid, 0)
    print(json.dumps({"ok": ok.wait(120), "dead": dead.wait(120), "pids": [ok.pid, dead.pid],
                      "unused": os.waitstatus_to_exitcode(unused)}))
""")

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import torch
    with open(os.path.join(os.environ["DLC_ATTEMPT_DIR"], f"seen-{os.environ['RANK']}.json"), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv, "threads": torch.get_num_threads(),
                   "sid": os.getsid(0), "pid": os.getpid(), "rand": torch.rand(1).item()}, f)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_forked_ranks_run_as_fresh_workers(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    agent = subprocess.run([sys.executable, "-c", AGENT, str(tmp_path), str(script)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert agent.returncode == 0, agent.stderr
    result = json.loads(agent.stdout.strip().splitlines()[-1])
    assert result["ok"] == 0 and result["dead"] == -9 and result["unused"] == 0, result
    seen = json.loads((tmp_path / "seen-0.json").read_text())
    # Exactly the handed environment, nothing of the agent's; a session of its own; torch's
    # threads as OMP_NUM_THREADS says; torch's RNG seeded afresh, as an import seeds it, not
    # shared with a sibling forked from the same agent.
    assert seen["env"] == {"PATH": os.environ["PATH"], "DLC_ATTEMPT_DIR": str(tmp_path),
                           "OMP_NUM_THREADS": "1", "RANK": "0", "ONLY_HERE": "x"}
    assert seen["argv"] == [str(script), "ok"] and seen["threads"] == 1
    assert seen["sid"] == seen["pid"] == result["pids"][0]
    assert seen["rand"] != json.loads((tmp_path / "seen-1.json").read_text())["rand"]
    records = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert records[0]["exit_code"] == 0
    # The bootstrap of rank 1 was killed; its agent recorded the death for it.
    assert records[1]["exit_code"] == 137 and records[1]["pid"] == result["pids"][1]


COLD = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    name = f"cold-{os.environ['DLC_ATTEMPT']}-{dist.get_rank()}.json"
    with open(os.path.join(os.environ["DLC_JOB_DIR"], name), "w") as f:
        json.dump({"argv": open("/proc/self/cmdline").read().split("\\0"), "sum": value.item(),
                   "ppid": os.getppid(), "threads": torch.get_num_threads()}, f)
    dist.destroy_process_group()
""")


def check_forked_start(launcher, fields: dict) -> None:
    """A 2x2 job submitted with `fields` (an engine's cluster) twice, forked (the default) and
    with DLC_FORKED_START=0: the ranks' programs and parents say which, and either way they
    form one group with torchrun's environment (test_slurm.py runs it on Slurm)."""
    script = launcher.script("cold.py", COLD)
    for env, forked in (({}, True), ({"DLC_FORKED_START": "0"}, False)):
        job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 2,
                                      "max_restarts": 0, "env": env, **fields})
        final = launcher.client.wait(job["id"], timeout=180)
        assert final["state"] == "SUCCEEDED", final["reason"]
        seen = []
        for rank in range(4):
            with open(os.path.join(final["job_dir"], f"cold-1-{rank}.json")) as f:
                seen.append(json.load(f))
        assert {s["sum"] for s in seen} == {10.0}  # 1 + 2 + 3 + 4: one group of four
        assert all(s["threads"] == 1 for s in seen)  # OMP_NUM_THREADS=1 from torchrun, as fresh
        for s in seen:
            # The program a rank's process runs: the agent it was forked from (whose command
            # line carries torchrun's, the bootstrap included), or the bootstrap itself.
            program = s["argv"][1:4]
            assert ("jupyter_dlc.node.standby" in program) == forked, s["argv"]
            assert ("jupyter_dlc.runtime.bootstrap" in program) != forked, s["argv"]
        # The node's two ranks share one parent: the agent that forked them (or torchrun's).
        assert seen[0]["ppid"] == seen[1]["ppid"] != seen[2]["ppid"] == seen[3]["ppid"]
        # No file of the attempt holds its token (a cold start has no go file).
        assert not os.path.exists(os.path.join(final["job_dir"], "attempt-1", "node-0.go"))


def test_a_cold_start_forks_its_ranks_from_one_agent_a_node_unless_told_not_to(launcher):
    """Without a pool or standby, each node's agent imports torch once and forks its ranks
    (node/standby.py --cold); `DLC_FORKED_START=0` in the job's env gives torchrun's own
    fresh interpreters. Either way the ranks form one group and get torchrun's environment."""
    check_forked_start(launcher, {})
    assert launcher.own_processes() == []
