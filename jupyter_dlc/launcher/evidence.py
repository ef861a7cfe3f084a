"""The scene kept before a kill: an evidence folder with the attempt.

Before the supervisor ends a hung or failing attempt it writes `attempt-<N>/evidence/`:

    index.json              what was kept and what was not, and why: {"attempt", "t",
                            "reason", "seconds", "files": [{"name", "what", "size"}],
                            "skipped": ["..."]}
    stacks-rank-<R>.txt     every live rank's Python stacks, as its reporter thread answered
                            the hang verdict's ask (runtime/stacks.py); a failing attempt's
                            survivors are not asked (that would hold up the restart)
    native-rank-<R>.txt     `py-spy dump --native` of each live rank of a hung attempt, where
                            py-spy is installed and the ranks are this machine's processes (an
                            engine whose ranks run here); not for a crashed attempt, whose
                            survivors are only blocked on the dead rank (their tracebacks are in
                            their logs) and whose restart must not wait ~0.1-0.3 s a rank
    nvidia-smi.txt          `nvidia-smi -q`, where it is on PATH (a GPU node whose ranks run here)
    nccl-rank-<R>.txt       the NCCL flight recorder's dump, when a rank sent one with its
                            stacks (shims/torch_private.nccl_flight_recorder)
    logs-tail.txt           the last TAIL_LINES lines of every rank's log

Bounded so recovery stays fast: the commands run side by side, at most COMMAND_SECONDS each
and BUDGET_SECONDS in all; at most FILE_BYTES a file and TOTAL_BYTES a folder; what did not
fit is named in `skipped`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import subprocess
import time
from typing import Any

from .. import layout

BUDGET_SECONDS = 5.0
COMMAND_SECONDS = 2.0
FILE_BYTES = 512 * 1024
TOTAL_BYTES = 8 * 1024 * 1024
TAIL_LINES = 40
TAIL_RANKS = 64
TAIL_BYTES = 64 * 1024
FOLDER = "evidence"


def _tail(path: str) -> list[str]:
    try:
        start = max(0, os.path.getsize(path) - TAIL_BYTES)
    except OSError:
        return []
    lines, _ = layout.read_log_lines(path, start, TAIL_BYTES)
    return (lines[1:] if start else lines)[-TAIL_LINES:]  # from mid-file, the first is partial


def _tool(name: str) -> str | None:
    """The tool installed beside the launcher's Python (where `pip install py-spy` puts it),
    else one on PATH. Beside first: a PATH of version-manager shims (pyenv) finds it through
    a shell script that costs 0.1 s a call, and a PATH of shims may not show it at all until
    a rehash."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which(name)


def evidence_dir(attempt_dir: str) -> str:
    return os.path.join(attempt_dir, FOLDER)


class _Folder:
    def __init__(self, path: str, deadline: float):
        self.path = path
        self.deadline = deadline
        self.files: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.total = 0

    def write(self, name: str, what: str, text: str) -> None:
        data = text.encode("utf-8", "replace")
        if len(data) > FILE_BYTES:
            data = data[:FILE_BYTES] + f"\n[cut at {FILE_BYTES} bytes]\n".encode()
        if self.total + len(data) > TOTAL_BYTES:
            self.skipped.append(f"{name}: the folder reached its {TOTAL_BYTES} bytes")
            return
        with open(os.path.join(self.path, name), "wb") as f:
            f.write(data)
        self.total += len(data)
        self.files.append({"name": name, "what": what, "size": len(data)})

    def run_all(self, commands: list[tuple[str, str, list[str]]]) -> None:
        """Run (file name, what, argv) commands side by side, each within COMMAND_SECONDS and
        all within the budget; their outputs are written in the order given."""
        running = []
        for name, what, argv in commands:
            try:
                running.append((name, what, argv, subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
            except OSError as error:
                self.skipped.append(f"{name}: {error}")
        deadline = min(self.deadline, time.monotonic() + COMMAND_SECONDS)
        for name, what, argv, proc in running:
            try:
                out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if proc.poll() is None:  # not one that finished while an earlier one ran over
                    proc.kill()
                    proc.communicate()
                    self.skipped.append(f"{name}: `{' '.join(argv)}` took over "
                                        f"{min(COMMAND_SECONDS, BUDGET_SECONDS):g} s")
                    continue
                out, err = proc.communicate()
            self.write(name, what, out + (f"\n[stderr]\n{err}" if err.strip() else ""))


def keep_scene(attempt_dir: str, attempt: int, reason: str, world: int,
               stacks: dict[int, dict] | None, live_pids: dict[int, int], ranks_here: bool,
               hung: bool = True) -> dict:
    """Write the evidence folder of an attempt about to be killed (`hung`: for a hang verdict,
    not a crash); returns its index."""
    started = time.monotonic()
    path = evidence_dir(attempt_dir)
    os.makedirs(path, exist_ok=True)
    folder = _Folder(path, started + BUDGET_SECONDS)
    for rank in sorted(stacks or {}):
        data = stacks[rank]  # type: ignore[index]
        text = f"rank {rank}, main thread:\n{data.get('main', '')}\nother threads:\n{data.get('threads', '')}"
        folder.write(f"stacks-rank-{rank}.txt", "Python stacks", text)
        if data.get("nccl"):
            folder.write(f"nccl-rank-{rank}.txt", "NCCL flight recorder", str(data["nccl"]))
    if not stacks:
        folder.skipped.append("Python stacks: asked only on a hang verdict (a failing attempt's "
                              "survivors are killed at once, so the restart does not wait)")
    commands: list[tuple[str, str, list[str]]] = []
    spy = _tool("py-spy")
    if not hung:
        folder.skipped.append("native stacks: kept for hang verdicts; a crashed attempt's "
                              "survivors are killed at once so that its restart does not wait")
    elif not spy:
        folder.skipped.append("native stacks: py-spy is not installed (pip install py-spy)")
    elif not ranks_here:
        folder.skipped.append("native stacks: the ranks run on other hosts (engines whose ranks run here only)")
    else:
        commands += [(f"native-rank-{rank}.txt", "native stacks (py-spy)",
                      [spy, "dump", "--native", "--pid", str(pid)])
                     for rank, pid in sorted(live_pids.items())]
    smi = shutil.which("nvidia-smi")
    if smi and ranks_here:
        commands.append(("nvidia-smi.txt", "nvidia-smi -q", [smi, "-q"]))
    else:
        folder.skipped.append("nvidia-smi -q: " + ("not on PATH (no GPU node)" if not smi
                                                    else "the ranks run on other hosts"))
    folder.run_all(commands)
    tails = []
    for rank in range(min(world, TAIL_RANKS)):
        tails.append(f"== rank {rank} ==")
        tails += _tail(layout.rank_log(attempt_dir, rank))
    if world > TAIL_RANKS:
        folder.skipped.append(f"log tails of ranks {TAIL_RANKS}-{world - 1}: at most {TAIL_RANKS} "
                              "ranks' (`jupyter-dlc logs JOB --rank R` has every rank's)")
    folder.write("logs-tail.txt", f"the last {TAIL_LINES} log lines of each rank", "\n".join(tails) + "\n")
    index = {"attempt": attempt, "t": time.time(), "reason": reason,
             "seconds": round(time.monotonic() - started, 3), "files": folder.files,
             "skipped": folder.skipped}
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return index


def listing(job_dir: str) -> list[dict]:
    """Every attempt's evidence index, oldest first, with the folder's path."""
    out = []
    names = [n for n in os.listdir(job_dir) if n.startswith("attempt-") and n[8:].isdigit()] \
        if os.path.isdir(job_dir) else []
    for name in sorted(names, key=lambda n: int(n[8:])):
        index_path = os.path.join(evidence_dir(os.path.join(job_dir, name)), "index.json")
        try:
            with open(index_path) as f:
                index = json.load(f)
        except (OSError, ValueError):
            continue
        out.append(dict(index, dir=os.path.dirname(index_path)))
    return out
