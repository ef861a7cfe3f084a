"""The two ends of one SSH node: `python -m jupyter_dlc.node.ssh_node ACTION`.

Stdlib only, and nothing of ours but the node reporter (stdlib only too): it runs on the
hosts, where only Python, torch and jupyter-dlc need to be.

    keep REQUEST      on the launcher's host: first preflight (below) over its own ssh, record
                      its exit in the node's preflight file and wait for every node's; only
                      when all passed, start `ssh` with the request's argv, hand the
                      remote end its payload on ssh's stdin and hold that stdin open for as
                      long as ssh runs; record ssh's exit code (the remote agent's, or 255 when
                      the connection failed; PREFLIGHT_FAILED when a node was unfit) in the
                      node's exit file. The request file holds the job token: it is read once
                      and deleted.
    preflight         on a host: as `run`, but the process is `jupyter_dlc.node.preflight`
                      (torch, the script, the checkpoint directory every node sees), which
                      reports its verdict to the launcher itself.
    run               on a host, under sshd: read the payload (argv, env, cwd, tags) as one
                      JSON line from stdin, start the torchrun agent in a session of its own
                      with that env (no shell parses any of it), and watch stdin: end of file
                      means the launcher's side is gone (ssh client or keeper killed, link cut
                      and sshd's ClientAlive gave up), and then every process of this node is
                      killed. On the agent's exit the same sweep runs, so nothing outlives it.
                      With the payload's `node_reporter`, the node reporter runs beside the
                      agent (jupyter_dlc.node.reporter) and ends with it.
    signal JOB ATTEMPT NODE SIG
                      on a host: send SIG to every process of that node of that attempt.
    probe             on a host: Python, torch, CPUs, GPUs and memory, as one JSON line.

Processes are found by their environment (`DLC_JOB_ID`, `DLC_ATTEMPT`, `DLC_HOST_NODE`, set
by `run` for the agent and inherited by every rank): torchrun puts each rank in a session of
its own, so a process group would miss them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from .. import layout
from . import reporter as node_reporter

# After stdin closes or the agent exits: how long the node's processes get after SIGTERM.
SWEEP_GRACE = 3.0
# A node's exit code when a preflight (its own or another node's) failed: no agent started.
PREFLIGHT_FAILED = 3
# Preflight waits up to 2 x 20 s for the other nodes (node/preflight.py); past this,
# a node that has not answered counts as failed.
PREFLIGHT_TIMEOUT = 120.0
# How a rank's log line travels over the ssh pipe without a shared filesystem:
# RANK_LINE + rank + RANK_SEP + the line (control characters a log does not start with).
RANK_LINE, RANK_SEP = b"\x1edlc-rank ", b"\x1f"
# The only variable `run` adds to the job's own: which node of the attempt a process is, so
# two nodes of one job on one host (or hosts sharing a process table) stay apart.
NODE_TAG = "DLC_HOST_NODE"


def tagged_pids(job: str, attempt: str, node: str) -> list[int]:
    wanted = {f"DLC_JOB_ID={job}".encode(), f"DLC_ATTEMPT={attempt}".encode(),
              f"{NODE_TAG}={node}".encode()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            found.append(int(entry))
    return found


def signal_node(job: str, attempt: str, node: str, sig: int) -> int:
    count = 0
    for pid in tagged_pids(job, attempt, node):
        try:
            os.kill(pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    return count


def sweep(job: str, attempt: str, node: str) -> None:
    """SIGTERM to what is left of the node, SIGKILL to what is left after the grace."""
    if not signal_node(job, attempt, node, signal.SIGTERM):
        return
    deadline = time.monotonic() + SWEEP_GRACE
    while time.monotonic() < deadline and tagged_pids(job, attempt, node):
        time.sleep(0.1)
    while signal_node(job, attempt, node, signal.SIGKILL):
        time.sleep(0.05)


def stage(payload: dict, job: str, attempt: str, node: str) -> str:
    """Without a shared filesystem: write the job's files (script, pushed files) into a
    directory of this node's own, and point the payload's paths under the launcher's job
    directory there. Returns the directory (removed when the node ends)."""
    staged = payload["stage"]
    for name in staged["files"]:
        if os.path.normpath(name) != name or name.startswith(("/", "..")):
            raise ValueError(f"stage: {name!r} is not a path inside the job directory")
    root = tempfile.mkdtemp(prefix=f"dlc-{job}-a{attempt}-n{node}-")
    for name, data in staged["files"].items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
    source = staged["from"].rstrip("/")

    def moved(value: str) -> str:
        return root + value[len(source):] if value == source or value.startswith(source + "/") else value

    payload["argv"] = [moved(a) for a in payload["argv"]]
    payload["env"] = {k: moved(v) for k, v in payload["env"].items()}
    payload["cwd"] = moved(payload.get("cwd") or root)
    os.makedirs(payload["env"]["DLC_ATTEMPT_DIR"], exist_ok=True)
    os.makedirs(payload["cwd"], exist_ok=True)
    return root


class RankLogs:
    """Forwards the rank logs the ranks write here (bootstrap: DLC_ATTEMPT_DIR/rank-R.log)
    over stdout, each line tagged with its rank, for the keeper to split back into the
    launcher's rank-R.log files. Complete lines only, but what is left at the end too."""

    def __init__(self, attempt_dir: str):
        self.attempt_dir = attempt_dir
        self.offsets: dict[str, int] = {}
        self.lock = threading.Lock()

    def forward(self, final: bool = False) -> None:
        with self.lock:
            for name in sorted(os.listdir(self.attempt_dir)):
                match = re.fullmatch(r"rank-(\d+)\.log", name)
                if not match:
                    continue
                path = os.path.join(self.attempt_dir, name)
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(name, 0))
                    data = f.read()
                if not final:
                    data = data[:data.rfind(b"\n") + 1]
                if not data:
                    continue
                self.offsets[name] = self.offsets.get(name, 0) + len(data)
                out = b"".join(RANK_LINE + match.group(1).encode() + RANK_SEP + line + b"\n"
                               for line in data.splitlines())
                sys.stdout.buffer.write(out)
                sys.stdout.buffer.flush()

    def follow(self, done: threading.Event) -> None:
        while not done.wait(0.2):
            self.forward()


def run(check: bool = False) -> int:
    """The node's agent (or, with `check`, its preflight) under the stdin watch."""
    payload = json.loads(sys.stdin.buffer.readline() or b"{}")
    tags = payload["tags"]
    job, attempt, node = str(tags["job"]), str(tags["attempt"]), str(tags["node"])
    root = stage(payload, job, attempt, node) if payload.get("stage") else None
    try:
        return _run(payload, job, attempt, node, check, root)
    finally:
        if root:
            shutil.rmtree(root, ignore_errors=True)


def _run(payload: dict, job: str, attempt: str, node: str, check: bool, root: str | None) -> int:
    env = dict(os.environ, **payload["env"], **{NODE_TAG: node})
    cwd = payload.get("cwd") or os.path.expanduser("~")
    argv = [sys.executable, "-m", "jupyter_dlc.node.preflight"] if check else payload["argv"]
    reporter = None
    if payload.get("node_reporter") and not check:
        # Its URL file goes where this host's ranks look (no shared filesystem needed).
        env[node_reporter.ENV] = node_reporter.url_file(env["DLC_ATTEMPT_DIR"], node)
        reporter = _start(node, "the node reporter", [sys.executable, "-m", "jupyter_dlc.node.reporter"],
                          env, cwd)
    agent = _start(node, "the agent", argv, env, cwd)
    if agent is None:
        _end(reporter)
        return 127
    logs = RankLogs(env["DLC_ATTEMPT_DIR"]) if root and not check else None
    done = threading.Event()
    if logs:
        threading.Thread(target=logs.follow, args=(done,), daemon=True).start()

    def watch_stdin() -> None:
        # Nothing more is ever sent: a read returns only at end of file, which is the
        # launcher's side going away. A raw read: a daemon thread blocked in the buffered
        # reader holds its lock, and the interpreter aborts on it at exit.
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        if agent.poll() is None:
            _end(reporter)
            sweep(job, attempt, node)

    threading.Thread(target=watch_stdin, daemon=True).start()
    code = agent.wait()
    _end(reporter)  # the ranks are gone (the agent waits for them): nothing is in flight
    sweep(job, attempt, node)  # a rank the agent left behind, a daemon it started
    done.set()
    if logs:
        logs.forward(final=True)
    return 128 - code if code < 0 else code


def _start(node: str, what: str, argv: list[str], env: dict[str, str],
           cwd: str) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=sys.stdout, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as error:
        print(f"jupyter-dlc ssh node {node}: cannot start {what}: {error}", flush=True)
        return None


def _end(reporter: subprocess.Popen | None) -> None:
    """The node reporter ignores the SIGTERM of a stop (it serves the ranks' last reports)
    and holds no data of its own: once its ranks are done, it is killed outright."""
    if reporter is not None and reporter.poll() is None:
        reporter.kill()
        reporter.wait()


def _write_code(path: str, code: int) -> None:
    layout.write_atomic(path, f"{code}\n")


def _gate(request: dict) -> bool:
    """This node's preflight over ssh, then every node's verdict (each node's keeper writes
    its own): True when all passed, so the agents start on all hosts or on none."""
    gate = request["preflight"]
    check = subprocess.Popen(gate["argv"], stdin=subprocess.PIPE, stdout=sys.stdout,
                             stderr=subprocess.STDOUT)
    assert check.stdin is not None  # a pipe, asked for
    try:  # stdin stays open while the check runs: its end would sweep the host's side
        check.stdin.write(json.dumps(request["payload"]).encode() + b"\n")
        check.stdin.flush()
    except OSError:
        pass  # ssh already gone: its exit code says so
    try:
        code = check.wait(timeout=PREFLIGHT_TIMEOUT)
    except subprocess.TimeoutExpired:
        check.kill()
        code = check.wait()
    check.stdin.close()
    _write_code(gate["result"], 128 - code if code < 0 else code)
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT
    while time.monotonic() < deadline:
        codes = [layout.read_int(path) for path in gate["results"]]
        if any(c not in (None, 0) for c in codes):
            return False
        if all(c == 0 for c in codes):
            return True
        time.sleep(0.1)
    return False


def split_rank_logs(stream, rank_dir: str) -> None:
    """The node's output until it ends: tagged lines into rank_dir/rank-R.log, the agent's
    own lines to stdout (the node log)."""
    files: dict[bytes, Any] = {}
    try:
        for line in stream:
            if line.startswith(RANK_LINE):
                rank, _, text = line[len(RANK_LINE):].partition(RANK_SEP)
                if rank.isdigit():
                    if rank not in files:
                        files[rank] = open(os.path.join(rank_dir, f"rank-{int(rank)}.log"), "ab")
                    files[rank].write(text)
                    files[rank].flush()
                    continue
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
    finally:
        for f in files.values():
            f.close()


def keep(request_path: str) -> int:
    with open(request_path) as f:
        request = json.load(f)
    os.unlink(request_path)  # it holds the job token
    if request.get("preflight") and not _gate(request):
        print("jupyter-dlc: preflight failed on a node; no agent started", flush=True)
        _write_code(request["exit_path"], PREFLIGHT_FAILED)
        return PREFLIGHT_FAILED
    rank_dir = request.get("rank_logs")  # no shared filesystem: rank logs come over the pipe
    ssh = subprocess.Popen(request["argv"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE if rank_dir else sys.stdout, stderr=subprocess.STDOUT)
    assert ssh.stdin is not None  # a pipe, asked for
    try:
        ssh.stdin.write(json.dumps(request["payload"]).encode() + b"\n")
        ssh.stdin.flush()
    except OSError:
        pass  # ssh already gone (host unreachable): its exit code says so
    if rank_dir:
        split_rank_logs(ssh.stdout, rank_dir)
    code = ssh.wait()  # stdin stays open until this process ends
    code = 128 - code if code < 0 else code  # ssh killed by a signal: the shell's convention
    _write_code(request["exit_path"], code)
    return code


def probe() -> int:
    import importlib.metadata
    import importlib.util

    try:
        torch = importlib.metadata.version("torch") if importlib.util.find_spec("torch") else None
    except importlib.metadata.PackageNotFoundError:
        torch = None
    memory_mb = 0
    try:
        with open("/proc/meminfo") as f:
            memory_mb = next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        pass
    gpus = len([n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()])
    print(json.dumps({"python": sys.version.split()[0], "torch": torch, "cpus": os.cpu_count() or 1,
                      "gpus": gpus, "memory_mb": memory_mb}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return run()
    if argv[:1] == ["keep"] and len(argv) == 2:
        return keep(argv[1])
    if argv[:1] == ["signal"] and len(argv) == 5:
        print(signal_node(argv[1], argv[2], argv[3], int(argv[4])))
        return 0
    if argv[:1] == ["probe"]:
        return probe()
    if argv[:1] == ["preflight"]:
        return run(check=True)
    print("usage: python -m jupyter_dlc.node.ssh_node run | keep REQUEST | "
          "signal JOB ATTEMPT NODE SIG | probe | preflight", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
