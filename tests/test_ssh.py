"""The SSH engine on real SSH hosts: `scripts/ssh-hosts.sh` makes two network namespaces on
a bridge, each with its own address and its own sshd (key auth only), and the module's
launcher listens on the bridge's address so that the ranks in the namespaces reach it.

The namespaces share this machine's process table and filesystem (the job directory is
shared, as the profile says). "Nothing left on a host" is checked by the processes that
carry the job's id, and by what runs in each namespace (`ip netns pids`).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from conftest import (
    LauncherEnv,
    assert_launcher_env,
    assert_torchrun_env,
    env_contract_spec,
    wait_for,
)
from test_ingest import THROUGH_NODE_REPORTERS, check_node_reporters
from test_jobs import ENV_SCRIPT, SLEEPER, rank_env
from test_notebook import run_notebook, text
from test_warm_ranks import check_forked_start

from jupyter_dlc import clusters, formatting, layout
from jupyter_dlc.node import ssh_node
from jupyter_dlc.hostprocs import job_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "ssh-hosts.sh")
CLUSTER = "local-ssh"
PREFIX, NET = "dlct", "10.232.0"  # apart from a user's own `ssh-hosts.sh up` (dlcssh, 10.231.0)
HOSTS = [f"{NET}.1", f"{NET}.2"]
BRIDGE = f"{NET}.254"

# The env-contract script, plus what shows where a rank ran: its network namespace.
WHERE_SCRIPT = ENV_SCRIPT.replace(
    '"argv":', '"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"), '
    '"netns": os.stat("/proc/self/ns/net").st_ino, "TRICKY": os.environ.get("TRICKY"), "argv":')

# Logs a step every 0.2 s for a long while, through the runtime (heartbeats included).
LONG_STEPS = """
import time
from jupyter_dlc import runtime
info = runtime.init()
for step in range(1, 100000):
    time.sleep(0.2)
    runtime.log(step, loss=1.0 / step)
"""


@contextlib.contextmanager
def ssh_hosts(root: pathlib.Path, prefix: str = PREFIX, net: str = NET):
    """Two SSH hosts of our own (namespaces `<prefix>1`, `<prefix>2` on a bridge at
    `<net>.254`, sshds, key, profile `local-ssh`), up while the block runs and down after it:
    nothing is left. Launchers started inside listen on the bridge. Yields the script's env."""
    env = dict(os.environ, DLC_SSH_DIR=str(root / "hosts"), DLC_SSH_PREFIX=prefix, DLC_SSH_NET=net,
               DLC_CLUSTERS=str(root / "dlc_clusters.yaml"), PYTHON=sys.executable)
    up = subprocess.run([SCRIPT, "up"], env=env, capture_output=True, text=True, timeout=600,
                        check=False)
    if up.returncode == 3:
        pytest.skip(f"SSH hosts cannot be made here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, up.stdout + up.stderr
    saved = {k: os.environ.get(k) for k in ("DLC_CLUSTERS", "DLC_LAUNCHER_HOST")}
    # The launchers of this module listen where the namespaces reach them.
    os.environ.update(DLC_CLUSTERS=env["DLC_CLUSTERS"], DLC_LAUNCHER_HOST=f"{net}.254")
    try:
        yield env
    finally:
        down = subprocess.run([SCRIPT, "down"], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert down.returncode == 0, down.stderr
    assert not os.path.exists(env["DLC_SSH_DIR"])
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{prefix}1" not in names and f"{prefix}2" not in names
    assert subprocess.run(["ip", "link", "show", f"{prefix}br"], capture_output=True).returncode != 0


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with ssh_hosts(tmp_path_factory.mktemp("ssh")) as env:
        yield env


@pytest.fixture
def launcher(hosts, tmp_path):
    env = LauncherEnv(str(tmp_path))  # started after DLC_CLUSTERS and DLC_LAUNCHER_HOST are set
    yield env
    env.close()


def ssh_options(hosts) -> list[str]:
    state = hosts["DLC_SSH_DIR"]
    return ["-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={state}/known_hosts",
            "-i", f"{state}/id_ed25519", "-p", "2222", "-l", "root"]


def namespace_pids(k: int) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", f"{PREFIX}{k}"], capture_output=True, text=True,
                         check=True).stdout
    return {int(p) for p in out.split()}


def sshd_pid(hosts, k: int) -> int:
    with open(os.path.join(hosts["DLC_SSH_DIR"], f"host{k}", "sshd.pid")) as f:
        return int(f.read())


def nothing_left_on_the_hosts(hosts) -> bool:
    """Each namespace runs its sshd and nothing else."""
    return all(namespace_pids(k) == {sshd_pid(hosts, k)} for k in (1, 2))


def job_pids(job_id: str) -> list[int]:
    return [pid for (job, _), pids in job_processes().items() if job == job_id for pid in pids]


def test_environment_contract_on_2x2_across_two_hosts(launcher, hosts, tmp_path):
    script = launcher.script("envjob.py", WHERE_SCRIPT)
    # A value a shell would act on arrives as it was written: no shell parses the env.
    pwned = tmp_path / "pwned"
    tricky = f"$(touch {pwned}); `touch {pwned}` 'single' \"double\" \\ ; echo\nsecond line"
    job = launcher.client.submit(env_contract_spec(script, tmp_path, cluster=CLUSTER, env={
        "USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0", "TRICKY": tricky}))
    job = launcher.client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["spec"]["engine"] == "ssh"  # the profile named the engine
    assert job["attempts"][0]["engine_id"] == ",".join(HOSTS)
    # The launcher serves the hosts at the bridge's address, and ranks report there; without
    # TLS beyond loopback it says loudly that tokens travel in clear.
    assert launcher.client.url.startswith(f"http://{BRIDGE}:")
    with open(os.path.join(launcher.data_dir, "launcher.log")) as f:
        assert f"WARNING: listening on {BRIDGE}:" in f.read()
    envs = rank_env(launcher.client, job["id"], 4)
    for rank, env in envs.items():
        node = rank // 2
        assert_torchrun_env(env, rank)
        # Rendezvous at node 0's own address, on the hosts' interface.
        assert env["MASTER_ADDR"] == HOSTS[0] and int(env["MASTER_PORT"]) > 0
        assert env["GLOO_SOCKET_IFNAME"] == "dlc0"
        # Each node really ran in its host's network namespace.
        assert env["netns"] == os.stat(f"/run/netns/{PREFIX}{node + 1}").st_ino
        assert_launcher_env(env, job, launcher, tmp_path)
        assert env["TRICKY"] == tricky
    assert not pwned.exists()
    # The agents' own output (torchrun's banner) came back over ssh into the node logs;
    # the request files that carried the token are gone.
    for node in (0, 1):
        with open(os.path.join(job["job_dir"], "attempt-1", f"node-{node}.log")) as f:
            assert "OMP_NUM_THREADS" in f.read()
        assert not os.path.exists(os.path.join(job["job_dir"], "attempt-1", f"node-{node}.ssh.json"))
    # Rank records came over the report route (DLC_RANK_RECORDS=report): no record files,
    # yet the launcher knows every rank's pid and exit; preflight ran on both hosts first.
    attempt_dir = layout.attempt_dir(job["job_dir"], 1)
    assert glob.glob(os.path.join(attempt_dir, "rank-*.json")) == []
    assert {(r["rank"], r["exit_code"]) for r in job["ranks"]} == {(r, 0) for r in range(4)}
    assert all(r["pid"] for r in job["ranks"])
    checks = [e["data"] for e in launcher.client.events(job["id"]) if e["type"] == layout.NODE_PREFLIGHT]
    assert sorted((c["node"], c["host"], c["ok"]) for c in checks) == [
        (0, HOSTS[0], True), (1, HOSTS[1], True)]
    shown = formatting.status_text(launcher.client.job(job["id"]))
    assert f"engine: ssh job {HOSTS[0]},{HOSTS[1]} on cluster local-ssh" in shown
    # Export works for an SSH job as for any other: plain run.sh and job.sbatch.
    from jupyter_dlc.export import export_job

    written = export_job(launcher.client, job["id"], str(tmp_path / "bundle"))
    assert {"run.sh", "job.sbatch", "script.py"} <= {os.path.basename(p) for p in written}
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on the hosts")


def test_an_ssh_hosts_agent_forks_its_ranks_unless_told_not_to(launcher, hosts):
    """As on every engine: each host's agent imports torch once and forks its ranks (the
    payload's argv is `-m jupyter_dlc.node.standby --cold`), or torchrun's own fresh
    interpreters with DLC_FORKED_START=0; either way one group of four across the hosts."""
    check_forked_start(launcher, {"cluster": CLUSTER})
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on the hosts")


def _profile(hosts) -> dict:
    import yaml

    with open(hosts["DLC_CLUSTERS"]) as f:
        return yaml.safe_load(f)["clusters"][CLUSTER]


def python_on_host2(tmp_path, name: str, prefix: str):
    """A Python for a profile that runs under `prefix` (a shell command line that ends by
    running its arguments) on host 2 only: a host made unlike the others."""
    wrapper = tmp_path / f"python-{name}-on-host2"
    wrapper.write_text(f"""#!/bin/sh
if ip -o addr show dlc0 2>/dev/null | grep -q ' {HOSTS[1]}/'; then
    exec {prefix} {sys.executable} "$@"
fi
exec {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


def test_a_host_that_sees_another_checkpoint_directory_fails_preflight_by_name(launcher, hosts, tmp_path):
    """Host 2 runs its Python in a mount namespace of its own with an empty tmpfs over the
    checkpoint directory (the same path, another directory: a node-local disk). Preflight
    runs on every host over ssh before any agent, names the host and the fix, no agent
    starts anywhere, and nothing is retried."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ran = tmp_path / "ran"
    wrapper = python_on_host2(tmp_path, "private-ckpt", "unshare -m --propagation private sh -c "
                              f"'mount -t tmpfs dlctest \"$0\" && exec \"$@\"' {ckpt}")
    clusters.put_profile("privateckpt", dict(_profile(hosts), engine="ssh", python=str(wrapper)))
    try:
        script = launcher.script("never.py", f"open({str(ran)!r}, 'a').close()\n")
        job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                      "cluster": "privateckpt", "max_restarts": 2,
                                      "checkpoint_dir": str(ckpt)})
        final = launcher.client.wait(job["id"], timeout=180)
    finally:
        clusters.remove_profile("privateckpt")
    assert final["state"] == "FAILED" and final["attempt"] == 1, final["reason"]
    assert final["reason"].startswith(f"preflight on node 1 ({HOSTS[1]}): {HOSTS[1]} does not see the "
                                      f"checkpoint directory {ckpt}"), final["reason"]
    assert "mount the same shared filesystem at that path on every node" in final["reason"]
    assert not ran.exists()  # no rank ran anywhere
    assert all(r["pid"] is None for r in final["ranks"])
    wait_for(lambda: not glob.glob(str(ckpt / ".dlc-preflight-*")), 60, what="no preflight marker left")
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 60, what="nothing left on the hosts")


def test_a_host_that_cannot_reach_the_launcher_fails_preflight_once_naming_it(launcher, hosts, tmp_path):
    """Host 2 runs its Python in a network namespace of its own (no route anywhere, the ssh
    pipe still works): its preflight verdict cannot reach the launcher. The keeper beside
    the launcher records the check's exit code, the attempt fails once naming the host and
    the launcher's URL, and is not restarted (its ranks could not have reported either)."""
    ran = tmp_path / "ran"
    wrapper = python_on_host2(tmp_path, "no-network", "unshare -n")
    clusters.put_profile("cutoff", dict(_profile(hosts), engine="ssh", python=str(wrapper)))
    try:
        script = launcher.script("never.py", f"open({str(ran)!r}, 'a').close()\n")
        job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                      "cluster": "cutoff", "max_restarts": 2})
        final = launcher.client.wait(job["id"], timeout=180)
    finally:
        clusters.remove_profile("cutoff")
    url = launcher.client.url.rstrip("/")
    assert final["state"] == "FAILED" and final["attempt"] == 1, final["reason"]
    assert final["reason"].startswith(f"preflight on node 1 ({HOSTS[1]}): it cannot reach the "
                                      f"launcher at {url}"), final["reason"]
    assert not ran.exists() and all(r["pid"] is None for r in final["ranks"])
    # Node 0 reached the launcher and said so; node 1's word is the keeper's record.
    verdicts = [e for e in launcher.client.events(job["id"]) if e["type"] == "node_preflight"]
    assert [(e["data"]["node"], e["data"]["ok"]) for e in verdicts] == [(0, True)], verdicts
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 60, what="nothing left on the hosts")


# Reports that went through the node's reporter, once a metric was delivered.
VIA_NODE = """
def via_node():
    from jupyter_dlc import runtime
    from jupyter_dlc.runtime.report import get_reporter
    runtime.log(0, probe=1.0)
    assert get_reporter().flush(60)
    return get_reporter().reports_via_node
"""
SEES = VIA_NODE + WHERE_SCRIPT.replace(
    '"argv":', '"sees_launcher_data": os.path.exists(os.environ["LAUNCHER_DATA"] + "/jobs"), '
    '"attempt_dir": os.environ["DLC_ATTEMPT_DIR"], "node_reporter": os.environ.get("DLC_NODE_REPORTER"), '
    '"via_node": via_node(), '
    '"pushed": open(os.environ["DLC_JOB_DIR"] + "/files/data.txt").read(), "argv":')

FAILS_ON_RANK_3 = """
import os, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 3:
    time.sleep(1)
    raise ValueError("shard 7 is corrupt")
while True:
    time.sleep(0.2)
"""


def test_hosts_without_a_shared_filesystem_get_files_in_the_payload_and_send_logs_back(
        launcher, hosts, tmp_path):
    """Both hosts run their Python in a mount namespace where the launcher's data directory
    is an empty tmpfs: they cannot see the job directory. The script travels in the ssh
    payload into a directory of each host's own, rank logs come back over the ssh pipe into
    the launcher's rank-R.log, records and first errors over the report route; checkpoints
    go to the profile's checkpoint_dir, which every host sees."""
    wrapper = tmp_path / "python-without-launcher-data"
    wrapper.write_text(f"""#!/bin/sh
exec unshare -m --propagation private sh -c 'mount -t tmpfs dlchidden "$0" && exec "$@"' \\
    {launcher.data_dir} {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    ckpt = tmp_path / "ckpt"
    clusters.put_profile("noshare", dict(_profile(hosts), engine="ssh", python=str(wrapper),
                                         shared_filesystem=False, checkpoint_dir=str(ckpt)))
    try:
        script = launcher.script("envjob.py", SEES)
        data = tmp_path / "data.txt"
        data.write_text("pushed value")
        job = launcher.client.submit(env_contract_spec(script, tmp_path, cluster="noshare", env={
            "USER_VAR": "x", "NCCL_SOCKET_IFNAME": "lo0", "LAUNCHER_DATA": launcher.data_dir},
            files={"data.txt": str(data)}))
        job = launcher.client.wait(job["id"], timeout=180)
        assert job["state"] == "SUCCEEDED", job["reason"]
        envs = rank_env(launcher.client, job["id"], 4)  # from the per-rank logs
        for rank, env in envs.items():
            node = rank // 2
            assert_torchrun_env(env, rank)
            assert env["netns"] == os.stat(f"/run/netns/{PREFIX}{node + 1}").st_ino
            assert env["sees_launcher_data"] is False  # the job directory was out of sight
            assert env["pushed"] == "pushed value"  # pushed files travel with the script
            staged = env["DLC_JOB_DIR"]
            assert os.path.basename(staged).startswith(f"dlc-{job['id']}-a1-n{node}-"), staged
            assert env["attempt_dir"].startswith(staged + "/")
            # The node reporter's URL file is in the host's own attempt directory, and the
            # rank's reports went through it.
            assert env["node_reporter"] == f"{env['attempt_dir']}/node-{node}.reporter"
            assert env["via_node"] > 0
            assert env["DLC_CHECKPOINT_DIR"] == str(ckpt / job["id"])
            assert env["argv"] == ["--lr", "0.1"] and env["USER_VAR"] == "x" and env["sum"] == 6.0
            assert env["DLC_LAUNCHER_URL"] == launcher.client.url
        attempt_dir = layout.attempt_dir(job["job_dir"], 1)
        for rank in range(4):
            with open(layout.rank_log(attempt_dir, rank)) as f:
                assert "\nENV {" in "\n" + f.read(), rank
        assert glob.glob(os.path.join(attempt_dir, "rank-*.json")) == []
        # Each host removed its job directory at the end.
        wait_for(lambda: not [p for e in envs.values() for p in [e["DLC_JOB_DIR"]] if os.path.exists(p)],
                 30, what="the hosts' job directories removed")

        failing = launcher.client.submit({"script": launcher.script("fails.py", FAILS_ON_RANK_3),
                                          "nodes": 2, "nproc_per_node": 2, "cluster": "noshare",
                                          "max_restarts": 0})
        final = launcher.client.wait(failing["id"], timeout=180)
    finally:
        clusters.remove_profile("noshare")
    assert final["state"] == "FAILED"
    assert final["reason"].startswith(f"rank 3 on host {HOSTS[1]} exited with code 1"), final["reason"]
    [why] = launcher.client.diagnosis(failing["id"])
    assert "ValueError: shard 7 is corrupt" in why["line"], why
    lines = [line["text"] for line in launcher.client.logs(failing["id"])["lines"] if line["rank"] == 3]
    assert "rank 3 up" in lines and any("ValueError: shard 7 is corrupt" in t for t in lines), lines
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 60, what="nothing left on the hosts")


def test_a_profile_without_a_shared_filesystem_needs_a_checkpoint_dir_and_small_files(
        launcher, hosts, tmp_path):
    script = launcher.script("sleeper.py", SLEEPER)
    clusters.put_profile("nockpt", dict(_profile(hosts), engine="ssh", shared_filesystem=False))
    try:
        with pytest.raises(Exception) as error:
            launcher.client.submit({"script": script, "cluster": "nockpt"})
        big = tmp_path / "big.bin"
        with open(big, "wb") as f:
            f.truncate(33 * 2**20)
        with pytest.raises(Exception) as too_big:
            launcher.client.submit({"script": script, "cluster": "nockpt", "files": {"big.bin": str(big)},
                                    "checkpoint_dir": str(tmp_path / "ckpt")})
    finally:
        clusters.remove_profile("nockpt")
    assert str(error.value) == (
        "cluster nockpt: checkpoint_dir: the hosts do not share the launcher's job directory "
        "(shared_filesystem: false), so checkpoints need a directory every host and this machine "
        "see; set checkpoint_dir: PATH in the profile or pass --checkpoint-dir")
    assert str(too_big.value).startswith("files: the script and pushed files take 33.0 MiB, over the "
                                         "32 MiB that travel over ssh to cluster nockpt"), str(too_big.value)
    assert launcher.client.jobs() == []  # nothing stored for a refused job


@pytest.mark.parametrize("victim", ["ssh", "keeper"])
def test_a_killed_ssh_client_leaves_nothing_remote(hosts, tmp_path, victim):
    """No launcher here: the launcher-side process of one node (the ssh client, or the keeper
    that holds its stdin) is killed with -9, and the remote end must clean up by itself."""
    job = f"killtest-{victim}"
    payload = {"argv": [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
               "env": {"DLC_JOB_ID": job, "DLC_ATTEMPT": "1"}, "cwd": str(tmp_path),
               "tags": {"job": job, "attempt": 1, "node": 0}}
    request = tmp_path / "request.json"
    exit_path = tmp_path / "node-0.exit"
    argv = ["ssh", *ssh_options(hosts), HOSTS[1], "--", sys.executable, "-m",
            "jupyter_dlc.node.ssh_node", "run"]
    request.write_text(json.dumps({"argv": argv, "payload": payload, "exit_path": str(exit_path)}))
    keeper = subprocess.Popen([sys.executable, "-m", "jupyter_dlc.node.ssh_node", "keep", str(request)],
                              stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: ssh_node.tagged_pids(job, "1", "0"), 30, what="the remote command")
        remote = ssh_node.tagged_pids(job, "1", "0")
        assert set(remote) <= namespace_pids(2)  # it runs on host 2, not here
        if victim == "ssh":
            client = next(int(p) for p in os.listdir("/proc") if p.isdigit()
                          and _ppid(int(p)) == keeper.pid)
            os.kill(client, signal.SIGKILL)
        else:
            keeper.kill()
        wait_for(lambda: not ssh_node.tagged_pids(job, "1", "0"), 30, what="the remote command to end")
        wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on host 2")
        assert not request.exists()  # read once, then deleted: it may hold a token
    finally:
        keeper.kill()
        keeper.wait()
        ssh_node.signal_node(job, "1", "0", signal.SIGKILL)


def test_killing_a_jobs_ssh_client_fails_it_naming_the_host(launcher, hosts):
    script = launcher.script("steps.py", LONG_STEPS)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "heartbeat_interval": 1, "max_restarts": 0, "cluster": CLUSTER})
    wait_for(lambda: (launcher.client.job(job["id"])["last_step"] or 0) >= 5, 120, what="step 5")
    client = next(pid for pid in job_pids(job["id"]) if _cmdline(pid)[:1] == ["ssh"]
                  and HOSTS[1] in _cmdline(pid))
    os.kill(client, signal.SIGKILL)
    final = launcher.client.wait(job["id"], timeout=60)
    assert final["state"] == "FAILED"
    assert f"1 on host {HOSTS[1]} " in final["reason"], final["reason"]  # rank 1 or node 1
    wait_for(lambda: not job_pids(job["id"]), 60, what="no process of the job")
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on the hosts")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def test_a_cut_link_fails_the_job_with_a_reason_naming_the_host(launcher, hosts):
    script = launcher.script("steps.py", LONG_STEPS)
    job = launcher.client.submit({"script": script, "nodes": 2, "nproc_per_node": 1,
                                  "heartbeat_interval": 1, "heartbeat_misses": 3,
                                  "max_restarts": 0, "cluster": CLUSTER})
    wait_for(lambda: (launcher.client.job(job["id"])["last_step"] or 0) >= 5, 120, what="step 5")
    subprocess.run(["ip", "-n", f"{PREFIX}2", "link", "set", "dlc0", "down"], check=True)
    try:
        final = launcher.client.wait(job["id"], timeout=60)
    finally:
        subprocess.run(["ip", "-n", f"{PREFIX}2", "link", "set", "dlc0", "up"], check=True)
    assert final["state"] == "FAILED"
    # Rank 1 is node 1, on host 2: its heartbeats stopped reaching the launcher.
    assert final["reason"].startswith(f"rank 1 on host {HOSTS[1]} missed 3 heartbeats"), final["reason"]
    wait_for(lambda: not job_pids(job["id"]), 60, what="no process of the job")
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on the hosts")


def test_bad_specs_and_unreachable_hosts_get_one_line_errors(launcher, hosts, tmp_path):
    script = launcher.script("sleeper.py", SLEEPER)
    for spec, message in (
            ({"nodes": 3}, (f"nodes: 3 nodes but cluster {CLUSTER} has 2 hosts; use --nodes 2 or "
                            "fewer, or add hosts to the profile")),
            ({"resources": {"cpus": 4096}}, (f"resources.cpus: 4096 per node but a host of cluster "
                                             f"{CLUSTER} has {os.cpu_count()}; use --cpus-per-node "
                                             f"{os.cpu_count()} or less"))):
        with pytest.raises(Exception) as error:
            launcher.client.submit(dict({"script": script, "cluster": CLUSTER}, **spec))
        assert message in str(error.value)
    # Hosts written as ssh destinations (user@host, host:port) are refused with the fix.
    with open(hosts["DLC_CLUSTERS"]) as f:
        import yaml

        profile = yaml.safe_load(f)["clusters"][CLUSTER]
    # (The launcher reads the profile file on every submit: these are seen at once.)
    for name, host in (("userat", f"root@{HOSTS[0]}"), ("withport", f"{HOSTS[0]}:2222")):
        clusters.put_profile(name, dict(profile, engine="ssh", hosts=[host]))
        try:
            with pytest.raises(Exception) as error:
                launcher.client.submit({"script": script, "cluster": name})
        finally:
            clusters.remove_profile(name)
        assert str(error.value) == (f"cluster {name}: hosts: {host!r} carries a user or port; give "
                                    "them as `user:` and `port:` in the profile, and the bare host here")
    # A profile whose second host does not exist: the live check names it, and says NO.
    broken = tmp_path / "broken.yaml"
    broken.write_text(json.dumps({"clusters": {
        "gone": dict(profile, hosts=[HOSTS[0], f"{NET}.99"]), CLUSTER: profile}}))
    out = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "clusters"],
                         env=dict(os.environ, DLC_CLUSTERS=str(broken)), capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert rows[CLUSTER].split()[:5] == [CLUSTER, "ssh", "yes", "2", "0"]
    assert "torch 2." in rows[CLUSTER]
    assert rows["gone"].split()[:3] == ["gone", "ssh", "NO"] and f"{NET}.99:" in rows["gone"]


def test_a_launcher_on_loopback_refuses_ssh_jobs(hosts, tmp_path):
    """The hosts could not report to a launcher that listens on 127.0.0.1: refused at submit."""
    os.environ.pop("DLC_LAUNCHER_HOST")
    try:
        local_only = LauncherEnv(str(tmp_path))
    finally:
        os.environ["DLC_LAUNCHER_HOST"] = BRIDGE
    try:
        assert local_only.client.url.startswith("http://127.0.0.1:")
        script = local_only.script("sleeper.py", SLEEPER)
        with pytest.raises(Exception) as error:
            local_only.client.submit({"script": script, "cluster": CLUSTER})
        assert str(error.value) == (
            f"cluster {CLUSTER}: the launcher listens on 127.0.0.1, which the hosts cannot reach; "
            "restart it where they can (jupyter-dlc launcher stop, then "
            "DLC_LAUNCHER_HOST=<an address of this machine> jupyter-dlc launcher start)")
        assert local_only.client.jobs() == []
    finally:
        local_only.close()


def test_dlc_cell_on_ssh_hosts(launcher, tmp_path):
    nb = run_notebook([
        "%load_ext jupyter_dlc",
        ("%%dlc --cluster local-ssh --nodes 2 --nproc-per-node 2 --name nbssh --wait\n"
         "import os, torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo')\n"
         "t = torch.ones(1) * dist.get_rank()\n"
         "dist.all_reduce(t)\n"
         "print('SUM', t.item(), 'NODE', os.environ['DLC_NODE_RANK'])\n"),
        "%dlc status last",
    ], str(tmp_path))
    status = text(nb.cells[2])
    assert "SUCCEEDED" in status, text(nb.cells[1]) + status
    assert f"engine: ssh job {HOSTS[0]},{HOSTS[1]}" in status
    job = launcher.client.job("last")
    assert job["spec"]["cluster"] == CLUSTER and job["spec"]["engine"] == "ssh"
    lines = [line["text"] for line in launcher.client.logs(job["id"])["lines"]]
    assert sorted(t for t in lines if t.startswith("SUM ")) == [
        "SUM 6.0 NODE 0", "SUM 6.0 NODE 0", "SUM 6.0 NODE 1", "SUM 6.0 NODE 1"]


def test_ssh_hosts_script_is_idempotent_and_reports_status(hosts):
    pids = [sshd_pid(hosts, k) for k in (1, 2)]
    again = subprocess.run([SCRIPT, "up"], env=hosts, capture_output=True, text=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert [sshd_pid(hosts, k) for k in (1, 2)] == pids  # nothing restarted, nothing doubled
    status = subprocess.run([SCRIPT, "status"], env=hosts, capture_output=True, text=True,
                            timeout=60, check=False)
    assert status.returncode == 0
    assert status.stdout.count("answering (sshd pid") == 2, status.stdout


@pytest.fixture
def tls_launcher(hosts, tmp_path):
    """A launcher serving https on the bridge with a self-signed certificate made here."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=jupyter-dlc test launcher",
                    "-addext", f"subjectAltName=IP:{BRIDGE}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    tls = {"DLC_LAUNCHER_CERT": str(cert), "DLC_LAUNCHER_KEY": str(key)}
    os.environ.update(tls)
    try:
        env = LauncherEnv(str(tmp_path))
    finally:
        for name in tls:
            os.environ.pop(name)
    yield env
    env.close()


def test_a_tls_launcher_serves_the_hosts_over_https_through_node_reporters(tls_launcher, hosts, tmp_path):
    """2 hosts x 2 ranks: each host's node reporter forwards its ranks' reports as node
    batches over https, trusting the CA file the ranks are given; node 1's reporter is
    killed mid-job and its ranks report to the launcher directly, losing nothing."""
    from jupyter_dlc.client import LauncherClient, LauncherUnavailable

    client = tls_launcher.client
    assert client.url.startswith(f"https://{BRIDGE}:") and client.ca_file
    script = tls_launcher.script("through.py", THROUGH_NODE_REPORTERS)
    final = check_node_reporters(client, {"script": script, "cluster": CLUSTER}, tmp_path / "go")
    assert {r["last_step"] for r in final["ranks"]} == {39}
    wait_for(lambda: nothing_left_on_the_hosts(hosts), 30, what="nothing left on the hosts")
    # Without the CA the certificate is refused; plain http gets no answer from the port.
    with pytest.raises(LauncherUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        LauncherClient(client.url, client.token).jobs()
    with pytest.raises(LauncherUnavailable):
        LauncherClient(client.url.replace("https://", "http://"), client.token, timeout=5).jobs()
    with open(os.path.join(tls_launcher.data_dir, "launcher.log")) as f:
        log = f.read()
    assert "without TLS" not in log and f"launcher serving https://{BRIDGE}:" in log


def test_adopt_finds_a_whole_set_of_keepers_by_their_environment_and_kills_a_partial_one(tmp_path, monkeypatch):
    """A launcher killed between starting the keepers and storing their pids: the next one
    finds them by the job id and attempt in their environment and the node in their request
    path (real processes, the real /proc scan); keepers of only some nodes are killed, so the
    attempt is submitted again with no second keeper of a node beside a first."""
    from jupyter_dlc.engines.contract import AttemptContext
    from jupyter_dlc.engines.ssh import SSHEngine
    from jupyter_dlc.spec import JobSpec

    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    clusters.put_profile("adopt-hosts", {"engine": "ssh", "hosts": ["10.9.0.1", "10.9.0.2"], "interface": "lo"})
    spec = JobSpec(name="t", code="x", nodes=2, nproc_per_node=1, cluster="adopt-hosts", engine="ssh")
    ctx = AttemptContext("adopt-job", 3, spec, str(tmp_path), str(tmp_path / "attempt-3"), "", {}, 0)

    def keeper(node: int, attempt: int = 3) -> subprocess.Popen:
        # Not a real keeper: a process whose command line and environment read as one.
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "-m",
                                 "jupyter_dlc.node.ssh_node", "keep", f"{ctx.attempt_dir}/node-{node}.ssh.json"],
                                stdin=subprocess.PIPE, start_new_session=True,
                                env=dict(os.environ, DLC_JOB_ID="adopt-job", DLC_ATTEMPT=str(attempt)))

    engine = SSHEngine()
    assert engine.adopt(ctx) is None  # nothing there
    both = [keeper(0), keeper(1), keeper(0, attempt=2)]  # another attempt's is not this one's
    try:
        handle = engine.adopt(ctx)
        assert handle == {"engine_id": "10.9.0.1,10.9.0.2",
                          "nodes": [{"node": 0, "host": "10.9.0.1", "pid": both[0].pid},
                                    {"node": 1, "host": "10.9.0.2", "pid": both[1].pid}]}
    finally:
        for proc in both:
            proc.kill()
            proc.wait()
    lone = keeper(1)
    try:
        assert engine.adopt(ctx) is None
        assert lone.wait(timeout=10) == -signal.SIGKILL
    finally:
        lone.kill()
