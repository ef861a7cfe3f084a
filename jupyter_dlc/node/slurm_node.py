"""One Slurm node's task where the nodes do not see the launcher's job directory
(`shared_filesystem: false`): `python -m jupyter_dlc.node.slurm_node ACTION JOB_DIR CWD`.

Stdlib only, and nothing of ours but stdlib-only modules (layout, identity, the node
reporter, ssh_node's staging, the runtime's report sender): it runs on the nodes.

    preflight JOB_DIR CWD      decode the job's files (stdin, below) into a directory of this
                               node's own, run `runtime.node_preflight` there (torch, the
                               script, the checkpoint directory every node sees), remove it.
    run JOB_DIR CWD -- ARGV... the same directory, then the torchrun agent ARGV in it, with
                               the node reporter beside it where a node runs more than one
                               rank (node_reporter.wanted); the ranks' logs and
                               the agent's output are sent to the launcher as they grow
                               (`POST .../node-logs`), then the node's exit code as a
                               `node_exit` record event naming this Slurm job; the directory
                               is removed when the agent has ended.

The files come on stdin as the batch script holds them (`encode_payload`: base64 of the
gzipped JSON that `staging.staged_files` makes): srun hands its stdin to every task, on
every node, so each node decodes its own copy and needs nothing of the launcher's disk.
Paths under JOB_DIR in ARGV, CWD and the environment (DLC_JOB_DIR, DLC_ATTEMPT_DIR...)
point into the node's directory (`ssh_node.stage`, as on an SSH host): the ranks write
their logs there and the node reporter its URL file.
"""

from __future__ import annotations

import base64
import glob
import gzip
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

from .. import identity, layout
from . import reporter as node_reporter
from . import ssh_node

FORWARD_INTERVAL = 0.5   # seconds between two looks at the node's logs
BATCH_BYTES = 512 << 10  # text per request, under the launcher's 1 MiB (bodies.NODE_LOG_BYTES)
SEND_TIMEOUT = 5.0
# After the agent ended: how long the last lines and the node's exit may take to reach a
# launcher that is restarting (a record lost past it leaves the exit to Slurm's job state).
FINAL_TIMEOUT = 30.0
PAYLOAD_LINE = 76
# What the launcher's kill sends the steps (`scancel --signal=USR1`: not to the batch shell,
# which stays to remove the nodes' copies): the default action ends any process that does not
# handle it; `run` handles it by killing the rest of its node with SIGKILL.
KILL_SIGNAL = signal.SIGUSR1

# Step variables an inner srun (or a library that reads SLURM_PROCID as the rank, like
# Lightning's Slurm detection) would take for the ranks' own: torchrun owns rank and size.
STEP_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEPID",
             "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
             "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_TASKS_PER_NODE",
             "SLURM_NTASKS_PER_NODE", "SLURM_TASK_PID", "SLURM_GTIDS")


def encode_payload(files: dict[str, str]) -> str:
    """The job's files as the batch script carries them: base64 lines (no shell character)."""
    data = base64.b64encode(gzip.compress(json.dumps(files, sort_keys=True).encode(), 6)).decode()
    return "\n".join(data[i:i + PAYLOAD_LINE] for i in range(0, len(data), PAYLOAD_LINE))


def decode_payload(raw: bytes) -> dict[str, str]:
    return json.loads(gzip.decompress(base64.b64decode(b"".join(raw.split()))))


def sweep_earlier(job: str, attempt: int, node: str) -> None:
    """Directories an earlier attempt of the job left on this node (its task was killed with
    SIGKILL before it could remove its own): that attempt has ended, or this one would not run."""
    pattern = os.path.join(tempfile.gettempdir(), f"dlc-{job}-a*-n{node}-*")
    for path in glob.glob(pattern):
        match = re.fullmatch(rf"dlc-{re.escape(job)}-a(\d+)-n{re.escape(node)}-.*", os.path.basename(path))
        if match and int(match.group(1)) < attempt:
            shutil.rmtree(path, ignore_errors=True)


def stage_here(job_dir: str, cwd: str, argv: list[str]) -> tuple[str, dict]:
    """The job's files from stdin in a fresh directory of this node's; returns it and the
    payload (argv, env, cwd) with the job directory's paths pointing there."""
    files = decode_payload(sys.stdin.buffer.read())
    job, attempt = os.environ["DLC_JOB_ID"], os.environ["DLC_ATTEMPT"]
    node = os.environ.get("DLC_NODE_RANK", "0")
    sweep_earlier(job, int(attempt), node)
    payload = {"stage": {"from": job_dir, "files": files}, "argv": argv, "env": dict(os.environ),
               "cwd": cwd}
    return ssh_node.stage(payload, job, attempt, node), payload


class LogSender:
    """Sends the new complete lines of the node's logs (its ranks' `rank-R.log`, its own
    `node-K.log`) to the launcher, which appends them to the attempt's files of those names.
    An offset moves on only once the launcher took the lines: a launcher that is down or
    restarting gets them later."""

    def __init__(self, env: dict[str, str], attempt_dir: str, node: int):
        self.url = f"{env['DLC_LAUNCHER_URL'].rstrip('/')}/api/jobs/{env['DLC_JOB_ID']}/node-logs"
        self.headers = {"Content-Type": "application/json", "Authorization": f"token {env['DLC_TOKEN']}"}
        self.key = env.get(identity.KEY_ENV) or None
        self.tls = node_reporter.launcher_tls(env)
        self.attempt, self.node = int(env.get("DLC_ATTEMPT", "1")), node
        self.attempt_dir = attempt_dir
        self.offsets: dict[str, int] = {}
        self.stale = False  # the launcher said the attempt is over: nothing more is sent
        self.lock = threading.Lock()

    def _logs(self) -> list[tuple[str, int | None]]:
        found: list[tuple[str, int | None]] = [(layout.node_log(self.attempt_dir, self.node), None)]
        for name in sorted(os.listdir(self.attempt_dir)):
            match = re.fullmatch(r"rank-(\d+)\.log", name)
            if match:
                found.append((os.path.join(self.attempt_dir, name), int(match.group(1))))
        return found

    def _batch(self, final: bool) -> tuple[list[dict], dict[str, int]]:
        entries: list[dict] = []
        moved: dict[str, int] = {}
        room = BATCH_BYTES
        for path, rank in self._logs():
            if room <= 0:
                break
            offset = self.offsets.get(path, 0)
            lines, after = layout.read_log_lines(path, offset, room)
            text = "".join(line + "\n" for line in lines)
            if after == offset:
                text, after = _rest(path, offset, room, final)
            if after == offset:
                continue
            entries.append({"rank": rank, "text": text})
            moved[path] = after
            room -= len(text.encode())
        return entries, moved

    def send(self, final: bool = False) -> bool:
        """Everything new, in batches; False when the launcher did not take a batch. With
        `final` (the node's processes are gone) a last line without its newline goes too."""
        with self.lock:
            while not self.stale:
                entries, moved = self._batch(final)
                if not entries:
                    return True
                if not self._post(entries):
                    return False
                self.offsets.update(moved)
            return True

    def _post(self, entries: list[dict]) -> bool:
        data = json.dumps({"attempt": self.attempt, "node": self.node, "logs": entries}).encode()
        try:
            answer = identity.exchange(self.url, "POST", data, self.headers, self.key, SEND_TIMEOUT,
                                       self.tls)
        except (OSError, ValueError):
            return False
        if not answer.proven or answer.status >= 500:
            return False  # not the launcher (its port taken while it is down), or busy
        if answer.status >= 300:
            # Refused (a line the launcher will never take): said once here, and skipped.
            print(f"jupyter-dlc slurm node {self.node}: the launcher refused log lines "
                  f"({answer.status}): {answer.body[:300]!r}", file=sys.stderr, flush=True)
            return True
        self.stale = bool(json.loads(answer.body or b"{}").get("stale"))
        return True

    def follow(self, done: threading.Event) -> None:
        while not done.wait(FORWARD_INTERVAL):
            self.send()

    def finish(self, deadline: float) -> None:
        while not self.send(final=True) and time.monotonic() < deadline:
            time.sleep(0.5)


def kill_node(job: str, attempt: str, node: str) -> None:
    """SIGKILL to every process of this node of the attempt (the agent, its ranks, the node
    reporter: they carry ssh_node.NODE_TAG), until none is left."""
    deadline = time.monotonic() + 5.0
    while ssh_node.signal_node(job, attempt, node, signal.SIGKILL) and time.monotonic() < deadline:
        time.sleep(0.05)


def _rest(path: str, offset: int, room: int, final: bool) -> tuple[str, int]:
    """What `read_log_lines` leaves from `offset`, which has no newline yet: a line longer
    than a batch (sent in pieces, or that log would wait for ever), or, at the end, the
    last line without its newline. ("", offset) while it is an unfinished short line."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= offset or (not final and (room < BATCH_BYTES or size - offset < room)):
                return "", offset
            f.seek(offset)
            data = f.read(room)
    except OSError:
        return "", offset
    text = data.replace(b"\0", b"").decode("utf-8", errors="replace")
    return (text + "\n" if text else ""), offset + len(data)


def run(job_dir: str, cwd: str, argv: list[str]) -> int:
    # A stop's SIGTERM reaches every process of the step: this one stays to send the last
    # lines and the exit. A handler, not SIG_IGN: the agent it starts gets the default back.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # The launcher's kill (KILL_SIGNAL to the steps, slurm.py): SIGKILL to the rest of the
    # node from here, so that this process lives on to send the last lines and the exit.
    signal.signal(KILL_SIGNAL, lambda *_: kill_node(os.environ["DLC_JOB_ID"], os.environ["DLC_ATTEMPT"],
                                                    os.environ.get("DLC_NODE_RANK", "0")))
    root, payload = stage_here(job_dir, cwd, argv)
    try:
        return _run(payload)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(payload: dict) -> int:
    env = payload["env"]
    node = int(env.get("DLC_NODE_RANK", "0"))
    env[ssh_node.NODE_TAG] = str(node)  # what kill_node finds the node's processes by
    nproc = int(env.get("DLC_NPROC_PER_NODE", "1") or 1)
    attempt_dir = env["DLC_ATTEMPT_DIR"]
    reporter = None
    if node_reporter.wanted(nproc):
        env[node_reporter.ENV] = node_reporter.url_file(attempt_dir, node)
        reporter = subprocess.Popen([sys.executable, "-m", "jupyter_dlc.node.reporter"], env=env,
                                    cwd=payload["cwd"], stdin=subprocess.DEVNULL)
    sender = LogSender(env, attempt_dir, node)
    done = threading.Event()
    threading.Thread(target=sender.follow, args=(done,), daemon=True).start()
    with open(layout.node_log(attempt_dir, node), "ab") as log:
        try:
            agent = subprocess.Popen(payload["argv"], env=env, cwd=payload["cwd"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        except OSError as error:
            log.write(f"jupyter-dlc slurm node {node}: cannot start the agent: {error}\n".encode())
            agent = None
    code = 127 if agent is None else agent.wait()
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    ssh_node._end(reporter)  # the ranks are gone (the agent waits for them)
    done.set()
    deadline = time.monotonic() + FINAL_TIMEOUT
    sender.finish(deadline)
    report_exit(env, node, nproc, code, deadline)
    return code


def report_exit(env: dict[str, str], node: int, nproc: int, code: int, deadline: float) -> None:
    """The node's exit as a record event, naming the Slurm job that ran it (only the
    attempt's own counts: slurm.reported_exit), as the node's first rank reports."""
    now = time.time()
    body = {"rank": node * nproc, "node": node, "attempt": int(env.get("DLC_ATTEMPT", "1")), "t": now,
            "events": [{"type": layout.NODE_EXIT, "t": now, "node": node, "exit_code": code,
                        "engine_id": os.environ.get("SLURM_JOB_ID", "")}]}
    status = node_reporter.post_until(
        f"{env['DLC_LAUNCHER_URL'].rstrip('/')}/api/jobs/{env['DLC_JOB_ID']}/report",
        json.dumps(body).encode(), env["DLC_TOKEN"], env.get(identity.KEY_ENV) or None,
        node_reporter.launcher_tls(env), max(time.monotonic() + 1.0, deadline), SEND_TIMEOUT)
    if status != 200:
        print(f"jupyter-dlc slurm node {node}: the launcher did not take this node's exit "
              f"({status or 'no answer'}); Slurm's job state stands for it", file=sys.stderr, flush=True)


def preflight(job_dir: str, cwd: str) -> int:
    root, payload = stage_here(job_dir, cwd, [])
    try:
        return subprocess.call([sys.executable, "-m", "jupyter_dlc.node.preflight"],
                               env=payload["env"], cwd=payload["cwd"], stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["preflight"] and len(argv) == 3:
        return preflight(argv[1], argv[2])
    if argv[:1] == ["run"] and "--" in argv and argv.index("--") == 3:
        return run(argv[1], argv[2], argv[4:])
    print("usage: python -m jupyter_dlc.node.slurm_node preflight JOB_DIR CWD | "
          "run JOB_DIR CWD -- ARGV...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
