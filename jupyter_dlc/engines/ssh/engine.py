"""SSH engine: one torchrun agent per host of a cluster profile, each over its own ssh.

    launcher host                                   host K (profile `hosts[K]`)
    ssh_node keep ──ssh -T (BatchMode, keys)──▶ sshd ──▶ ssh_node run ──▶ torchrun agent ──▶ ranks
      │ stdin: the payload line, then held open          │ stdin EOF: kill the node's processes
      └ node-K.log ◀── agent output over the ssh pipe    └ exit code ──▶ ssh ──▶ node-K.exit

- Nothing the job carries is parsed by a shell: the remote command line is fixed
  (`PYTHON -m jupyter_dlc.node.ssh_node run`, each word quoted), and the agent's argv, env
  (the job token among it) and working directory travel as one JSON line on ssh's stdin.
- The agents' output streams back over the ssh pipe into the attempt's `node-K.log`, so
  torchrun's failure summary (ranks killed by a signal) reaches the launcher without a
  shared filesystem; rank records and first errors come over the report route
  (`DLC_RANK_RECORDS=report`). Without a shared filesystem (`shared_filesystem: false`) the
  script and pushed files travel in the payload into a directory of the host's own, and the
  ranks' logs come back over the pipe, tagged per rank, into the launcher's `rank-R.log`;
  checkpoints need the profile's `checkpoint_dir`, which every host and the launcher see.
- Where a node runs more than one rank, `run` starts the node reporter (node/reporter.py)
  beside the agent and names its URL file, in the attempt directory the host sees (its own
  copy without a shared filesystem), in the ranks' `DLC_NODE_REPORTER`.
- Preflight (`node/preflight.py`) runs on every host over ssh before any agent: each
  keeper runs its node's and waits for all verdicts, so agents start everywhere or nowhere.
- Nothing outlives its job on any host: `run` kills every process of its node when its
  stdin closes (the ssh client or its keeper was killed, or sshd dropped a dead connection)
  and when the agent exits; stop and kill reach the hosts with
  `ssh_node signal` (SIGTERM, SIGKILL) over a fresh connection.
- Rendezvous is static at node 0's address (`master_addr`, else `hosts[0]`), on the
  profile's `interface` (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), as FIELD-NOTES found.

The handle keeps each node's host and keeper pid; keepers run in sessions of their own, so
a launcher killed with -9 re-adopts the attempt from them and the exit files.
"""

from __future__ import annotations

import json
import os
import re
import signal as signals
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from ... import hostprocs, layout, shell
from ...node import reporter as node_reporter
from ...spec import JobSpec
from .. import staging
from ..children import spawn
from ..contract import (
    AttemptContext,
    AttemptStatus,
    Capabilities,
    DryRun,
    Engine,
    NodeStatus,
    Phase,
    RankStatus,
    failed_preflight,
    rank_records,
    remove_preflight_markers,
    unreachable_launcher,
)
from ...engine_registry import Option
from ..remote_env import job_script_env
from ..torchrun import agent_summary_codes, node_agent_argv

CONNECT_TIMEOUT = 5  # seconds for ssh to reach a host
# ssh gives up on a silent connection (a cut link) after about 2 x 3 s; the remote side's
# sshd does the same with its ClientAlive settings and then `run` cleans the host up.
ALIVE_INTERVAL, ALIVE_COUNT = 2, 3
SIGNAL_TIMEOUT = 15.0  # one round of `ssh_node signal` to every host
SSH_FAILED = 255  # ssh's own exit code: the connection failed or was lost
VANISHED_GRACE = 1.0
KILLED = 137


def _profile(spec: JobSpec):
    from ...clusters import engine_profile

    return engine_profile(spec.cluster, "ssh")


def ssh_argv(profile, host: str, remote: list[str]) -> list[str]:
    """ssh to `host` running `remote` (each word quoted for the remote shell, `shell.quote`): never a
    password or host-key prompt (BatchMode), keys only, a dead peer noticed in seconds."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
            "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
            "-o", "LogLevel=ERROR"]
    if profile.get("key"):
        argv += ["-i", os.path.expanduser(profile.get("key")), "-o", "IdentitiesOnly=yes"]
    if profile.get("known_hosts"):
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(profile.get('known_hosts'))}",
                 "-o", "StrictHostKeyChecking=yes"]
    if profile.get("port"):
        argv += ["-p", str(profile.get("port"))]
    if profile.get("user"):
        argv += ["-l", profile.get("user")]
    for option in profile.get("ssh_options") or []:
        argv += ["-o", option]
    # `--` before the host: ssh reads no option after it, so a host such as
    # `-oProxyCommand=...` (refused by the profile's validation anyway) stays a host name.
    error = shell.host_error(host)
    if error:
        raise ValueError(f"cluster {profile.name}: hosts: {error}; give a host name or address")
    return argv + ["--", host, *(shell.quote(word) for word in remote)]


def remote_python(spec: JobSpec, profile) -> str:
    return spec.python or profile.get("python") or "python3"


def _loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _keeper_node(pid: int) -> int | None:
    """The node a keeper process serves (`ssh_node keep <attempt dir>/node-K.ssh.json`), or
    None for any other process (its ssh client, a rank)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "jupyter_dlc.node.ssh_node" not in argv or "keep" not in argv:
        return None
    name = os.path.basename(argv[argv.index("keep") + 1]) if argv.index("keep") + 1 < len(argv) else ""
    number = name.removeprefix("node-").removesuffix(".ssh.json")
    return int(number) if number.isdigit() else None


def _hosts(profile) -> list[str]:
    return [str(h) for h in profile.get("hosts") or []]


def _run_all(argvs: list[list[str]], timeout: float) -> list[tuple[int, str]]:
    """Run commands at once (one per host), each (exit code, output); a host that does not
    answer in time counts as ssh's failure."""
    procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for argv in argvs]
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((proc.returncode, out))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append((SSH_FAILED, f"no answer in {timeout:g}s"))
    return results


def probe_hosts(profile, spec: JobSpec | None = None, timeout: float = 20.0) -> list[dict[str, Any]]:
    """What each host has (Python, torch, CPUs, GPUs, memory), or why it cannot be reached."""
    python = remote_python(spec or JobSpec(), profile)
    hosts = _hosts(profile)
    results = _run_all([ssh_argv(profile, host, [python, "-m", "jupyter_dlc.node.ssh_node", "probe"])
                        for host in hosts], timeout)
    rows = []
    for host, (code, out) in zip(hosts, results, strict=True):
        lines = out.strip().splitlines()
        try:
            row = json.loads(lines[-1]) if code == 0 and lines else None
        except ValueError:
            row = None
        if row is None:
            rows.append({"host": host, "ok": False,
                         "detail": lines[-1] if lines else f"ssh exit {code}"})
        else:
            rows.append(dict(row, host=host, ok=bool(row.get("torch")),
                             detail="" if row.get("torch") else f"no torch for {python}"))
    return rows


def _unreported_preflight(ctx: AttemptContext, nodes: list[NodeStatus]) -> str | None:
    """A node whose preflight failed where no `node_preflight` event can say why (its keeper,
    beside the launcher, recorded the check's exit code): it could not reach the launcher
    (PREFLIGHT_UNREACHABLE), ssh could not reach the host (255: ssh's own words from the node
    log, `ssh: connect to host H port P: Connection refused`), or its Python failed before the
    check ran. Without this the gate's failure would look like a crashed node and be restarted
    into the same wall: a node that preflight never reached fails each try alike."""
    for node in nodes:
        code = layout.read_int(layout.node_preflight_code(ctx.attempt_dir, node.node))
        where = f"node {node.node} ({node.host})"
        if code == layout.PREFLIGHT_UNREACHABLE:
            return unreachable_launcher(where, ctx)
        if code == SSH_FAILED:
            lines, _ = layout.read_log_lines(layout.node_log(ctx.attempt_dir, node.node), 0, 1 << 16)
            said = next((line for line in reversed(lines) if line.startswith("ssh:")), None)
            return (f"ssh to host {node.host} failed: {said or 'ssh exited with code 255'}; "
                    "check the profile's hosts, port and user, and that sshd answers there")
        if code not in (None, 0, 1):  # 1: the check failed and said why (an event is coming)
            return (f"preflight on {where} ended with code {code} before it could report; "
                    f"see node-{node.node}.log")
    return None


class SSHEngine(Engine):
    submit_verb = "ssh"
    profile_options = {
        "hosts": Option(list, "a list of host names or addresses, node 0 first"),
        "user": Option(str, "the login name on the hosts"), "port": Option(int, "sshd's port, e.g. 22"),
        "key": Option(str, "a private key file (no passphrase, or one in ssh-agent)"),
        "known_hosts": Option(str, "a known_hosts file with the hosts' keys"),
        "ssh_options": Option(list, "a list of ssh -o options, e.g. [ProxyJump=bastion]"),
        "master_addr": Option(str, "node 0's address as the other hosts reach it (default: hosts[0])"),
        "shared_filesystem": Option(bool, "true when the hosts see the launcher's job directory"),
        "checkpoint_dir": Option(str, "a directory every host and the launcher see, for checkpoints "
                                 "(one per job under it); needed without a shared filesystem")}
    name = "ssh"

    def capabilities(self, spec: JobSpec) -> Capabilities:
        shared = bool(_profile(spec).get("shared_filesystem", False))
        return Capabilities(standby_agents=False, shared_filesystem=shared, per_rank_signals=False,
                            node_preflight=True)

    def capacity_error(self, spec: JobSpec) -> str | None:
        profile = _profile(spec)
        hosts = _hosts(profile)
        if not hosts:
            return f"cluster {profile.name}: hosts: none listed; add `hosts: [host1, host2]` to the profile"
        for host in hosts:
            if "@" in host or re.fullmatch(r"[^:]+:\d+", host):
                return (f"cluster {profile.name}: hosts: {host!r} carries a user or port; give them "
                        "as `user:` and `port:` in the profile, and the bare host here")
        if not profile.get("shared_filesystem"):
            problem = (staging.checkpoint_dir_error(spec, profile, "hosts")
                       or staging.size_error(spec, profile.name, "over ssh", "hosts"))
            if problem:
                return problem
        from ..contract import launcher_url

        reach = urllib.parse.urlsplit(launcher_url or "").hostname or ""
        if _loopback(reach) and not all(_loopback(h) for h in hosts[:spec.nodes]):
            return (f"cluster {profile.name}: the launcher listens on {reach}, which the hosts cannot "
                    "reach; restart it where they can (jupyter-dlc launcher stop, then "
                    "DLC_LAUNCHER_HOST=<an address of this machine> jupyter-dlc launcher start)")
        if spec.nodes > len(hosts):
            return (f"nodes: {spec.nodes} nodes but cluster {profile.name} has {len(hosts)} hosts; "
                    f"use --nodes {len(hosts)} or fewer, or add hosts to the profile")
        res = spec.resources
        wanted = [("resources.gpus", res.get("gpus") or 0, "gpus", "--gpus-per-node", ""),
                  ("resources.cpus", res.get("cpus") or 0, "cpus", "--cpus-per-node", ""),
                  ("resources.memory", res.get("memory_mb") or 0, "memory_mb", "--memory-per-node", "M")]
        if not any(amount for _, amount, _, _, _ in wanted):
            return None  # nothing to ask the hosts: submit without a round of ssh
        rows = probe_hosts(profile, spec)[:spec.nodes]
        for row in rows:
            if not row["ok"]:
                return f"cluster {profile.name}: host {row['host']}: {row['detail']}"
        for field_name, amount, key, flag, unit in wanted:
            have = min(row[key] for row in rows)
            if amount > have:
                return (f"{field_name}: {amount}{unit} per node but a host of cluster {profile.name} "
                        f"has {have}{unit}; use {flag} {have}{unit} or less")
        return None

    def checkpoint_dir(self, spec: JobSpec, job_id: str, job_dir: str) -> str:
        """The spec's, else the profile's `checkpoint_dir` (one directory per job under it:
        a path every host and the launcher see), else the job directory's."""
        return (staging.profile_checkpoint_dir(spec, _profile(spec), job_id)
                or super().checkpoint_dir(spec, job_id, job_dir))

    def check(self, profile) -> dict[str, Any]:
        rows = probe_hosts(profile)
        if not rows:
            return {"ok": False, "detail": "no hosts listed"}
        bad = [r for r in rows if not r["ok"]]
        detail = (f"{len(rows)} host(s), python {rows[0].get('python')}, torch {rows[0].get('torch')}"
                  if not bad else "; ".join(f"{r['host']}: {r['detail']}" for r in bad))
        return {"ok": not bad, "idle_nodes": len(rows) - len(bad),
                "gpus": sum(r.get("gpus") or 0 for r in rows if r["ok"]), "detail": detail}

    # -- submit ---------------------------------------------------------------------------
    def _payloads(self, ctx: AttemptContext) -> tuple[Any, list[str], list[dict[str, Any]]]:
        profile = _profile(ctx.spec)
        hosts = _hosts(profile)[:ctx.spec.nodes]
        master = profile.get("master_addr") or hosts[0]
        python = remote_python(ctx.spec, profile)
        env = job_script_env(ctx, profile)
        env.update(profile.env)
        env.update(ctx.spec.env)  # the user's --env wins, as with every engine
        payloads = []
        # Without a shared filesystem the job's files travel in the payload; the host writes
        # them into a directory of its own and points the job directory's paths there.
        stage = None if profile.get("shared_filesystem") else {"from": ctx.job_dir, "files": {}}
        for node in range(ctx.spec.nodes):
            # The agent imports torch once and forks its ranks, as on every engine
            # (torchrun.forked_start_wanted); ssh_node records its exit code itself.
            argv = node_agent_argv(ctx.spec, node, ctx.port or 29500, ctx.script_path, python,
                                   os.devnull, master_addr=master)
            payloads.append({"argv": argv, "cwd": ctx.spec.workdir or ctx.job_dir,
                             "env": dict(env, DLC_NODE_RANK=str(node), DLC_NODE_HOST=hosts[node]),
                             "tags": {"job": ctx.job_id, "attempt": ctx.attempt, "node": node},
                             "node_reporter": node_reporter.wanted(ctx.spec.nproc_per_node),
                             **({"stage": stage} if stage else {})})
        return profile, hosts, payloads

    def dry_run(self, ctx: AttemptContext) -> DryRun:
        profile, hosts, payloads = self._payloads(ctx)
        python = remote_python(ctx.spec, profile)
        return DryRun("ssh", cluster=profile.name, hosts=hosts,
                      commands=[ssh_argv(profile, host, [python, "-m", "jupyter_dlc.node.ssh_node", "run"])
                                for host in hosts],
                      native={"payloads": payloads})  # the token goes into each payload only at submit

    def submit(self, ctx: AttemptContext, request: DryRun) -> dict[str, Any]:
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        results = [layout.node_preflight_code(ctx.attempt_dir, n) for n in range(ctx.spec.nodes)]
        shared = self.capabilities(ctx.spec).shared_filesystem
        files = None if shared else staging.staged_files(ctx.job_dir)
        nodes = []
        for node, (host, argv, payload) in enumerate(zip(request.hosts, request.commands,
                                                         request.native["payloads"], strict=True)):
            payload["env"]["DLC_TOKEN"] = ctx.env["DLC_TOKEN"]
            if files is not None:
                payload["stage"] = dict(payload["stage"], files=files)
            path = os.path.join(ctx.attempt_dir, f"node-{node}.ssh.json")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                # Preflight on every host before any agent (the keepers gate on each other's
                # verdicts): a node that fails reports why over the route, and none starts.
                preflight = {"argv": argv[:-1] + ["preflight"], "result": results[node], "results": results}
                json.dump({"argv": argv, "payload": payload, "preflight": preflight,
                           "exit_path": layout.node_exit(ctx.attempt_dir, node),
                           "rank_logs": None if shared else ctx.attempt_dir}, f)
            # The keeper runs here, in a session of its own (it outlives the launcher) and in
            # the attempt's cgroup; it carries the job's id, so the supervisor sees it alive.
            pid = spawn(ctx, node, [sys.executable, "-m", "jupyter_dlc.node.ssh_node", "keep", path])
            nodes.append({"node": node, "host": host, "pid": pid})
        return {"engine_id": ",".join(request.hosts), "nodes": nodes}

    def adopt(self, ctx: AttemptContext) -> dict[str, Any] | None:
        """The attempt's keepers, found by the job id and attempt in their environment and
        the node in their request path (a launcher killed between starting them and storing
        their pids). Only a whole set is adopted: keepers of some nodes but not all (killed
        mid-submit) could never pass the preflight gate, so they are killed and the attempt
        is submitted again; no second keeper of a node ever runs beside a first."""
        keepers: dict[int, int] = {}
        for pid in hostprocs.job_processes().get((ctx.job_id, ctx.attempt), []):
            node = _keeper_node(pid)
            if node is not None:
                keepers[node] = pid
        if not keepers:
            return None
        hosts = _hosts(_profile(ctx.spec))[:ctx.spec.nodes]
        if sorted(keepers) != list(range(ctx.spec.nodes)):
            for pid in keepers.values():
                try:
                    os.killpg(pid, signals.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return None
        return {"engine_id": ",".join(hosts),
                "nodes": [{"node": n, "host": hosts[n], "pid": keepers[n]} for n in sorted(keepers)]}

    # -- describe -------------------------------------------------------------------------
    def node_host(self, ctx: AttemptContext, handle: dict[str, Any], node: int) -> str | None:
        return next((n["host"] for n in handle.get("nodes", []) if n["node"] == node), None)

    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        status = AttemptStatus()
        keepers = {n["node"]: n for n in handle.get("nodes", [])}
        for node in range(ctx.spec.nodes):
            code = layout.read_int(layout.node_exit(ctx.attempt_dir, node))
            keeper = keepers.get(node, {})
            running = code is None and bool(keeper.get("pid")) and hostprocs.alive(keeper["pid"])
            if code is None and keeper.get("pid") and not running:
                # Gone: it recorded ssh's exit as it left, or it was killed before it could.
                code = layout.read_int(layout.node_exit(ctx.attempt_dir, node))
                code = KILLED if code is None else code
            status.nodes.append(NodeStatus(node, running, code, keeper.get("host")))
        status.alive = any(n.running for n in status.nodes)
        status.phase = Phase.RUNNING if status.alive else Phase.ENDED
        # No agent started: fix and resume.
        status.reason = failed_preflight(ctx.reported) or _unreported_preflight(ctx, status.nodes)
        summary = agent_summary_codes(ctx.attempt_dir, ctx.spec.nodes)
        records = rank_records(ctx)  # reported over the route: the ranks write no files
        for rank in range(ctx.spec.world_size):
            record = records[rank]
            host_node = status.nodes[rank // ctx.spec.nproc_per_node]
            code = record.get("exit_code")
            if code is None:
                code = summary.get(rank)
            if code is None and host_node.exit_code == 0:
                code = 0  # left with os._exit before its record; its agent saw it exit 0
            if code is None and host_node.exit_code is not None and record.get("pid"):
                code = KILLED if host_node.exit_code != SSH_FAILED else None
            pid = record.get("pid")
            running = code is None and pid is not None and host_node.running
            status.ranks[rank] = RankStatus(rank, pid, running, code, record.get("start"), record.get("end"))
        return status

    # -- stop, kill, cleanup --------------------------------------------------------------
    def _signal(self, ctx: AttemptContext, handle: dict[str, Any], sig: int) -> list[tuple[int, str]]:
        profile = _profile(ctx.spec)
        python = remote_python(ctx.spec, profile)
        nodes = handle.get("nodes", [])
        return _run_all([ssh_argv(profile, n["host"], [python, "-m", "jupyter_dlc.node.ssh_node", "signal",
                                                       ctx.job_id, str(ctx.attempt), str(n["node"]), str(int(sig))])
                         for n in nodes], SIGNAL_TIMEOUT)

    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        """SIGTERM to every process of the job on every host; the supervisor kills after `grace`."""
        self._signal(ctx, handle, signals.SIGTERM)

    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        """SIGKILL on every host that answers; the keepers (and their ssh clients) here go
        too, which closes the remote ends' stdin: a host that did not answer cleans itself
        up when its sshd notices the connection is gone."""
        self._signal(ctx, handle, signals.SIGKILL)
        for node in handle.get("nodes", []):
            if not hostprocs.alive(node["pid"]):
                continue
            try:
                os.killpg(node["pid"], signals.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def cleanup(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        if handle.get("nodes") and self.describe(ctx, handle).alive:
            self.kill(ctx, handle)
        remove_preflight_markers(ctx)
