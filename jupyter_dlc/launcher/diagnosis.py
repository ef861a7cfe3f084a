"""First-error diagnosis of a failed attempt, from the files the bootstrap and torchrun write.

Triage as our users do it (seeds/003): line the ranks up by time, take the FIRST error, read
the 20 lines before it, and do not be misled by echoes. In a gloo/NCCL job one real failure
makes every other rank fail too ("Connection closed by peer" from a collective, or a SIGTERM
from its torchrun agent cleaning up), and torchrun's own "Root Cause (first observed
failure)" often names such an echo. So ranks whose failure is only an echo rank after every
rank with a failure of its own, whatever the clock says.

Inputs, in the attempt directory: `rank-R.log`, `rank-R.json`, `rank-R.error.json` (or the
same records as the ranks reported them over the report route, `reported`),
`node-K.log` (the agent's output: its failure summary and which pids it sent closing
signals to), plus the exit codes the launcher knows and optional per-node evidence:
`nodes_info = {node: {"kernel_log": str | [str], "oom_kill": int}}` (dmesg lines, the cgroup's
oom_kill counter) to tell a kernel OOM kill from any other SIGKILL.

Stdlib only.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .. import layout
from ..engines.contract import reported_records
from ..shims import torch_private
from .source_origin import SourceOrigin, source_origin

CONTEXT_LINES = 20
# Only the end of a log is read: a job that printed 50 MB must not stall the supervisor or
# grow its memory. A failure's traceback is at the end of its rank's log.
TAIL_BYTES = 1 << 20

# What torch says when a GPU script runs where there is no GPU, by cause.
_NO_CUDA_BUILD = [r"Torch not compiled with CUDA enabled", r"has no attribute '_cuda_\w+'",
                  r"Distributed package doesn't have NCCL built in", r"NCCL is not available",
                  r"torch\.cuda\.\w+ is not available in this build"]
_NO_DEVICE = [r"No CUDA GPUs are available", r"no CUDA-capable device is detected",
              r"Found no NVIDIA driver", r"ProcessGroupNCCL is only supported with GPUs",
              r"invalid device ordinal"]
_NO_CUDA_BUILD_RE = re.compile("|".join(_NO_CUDA_BUILD), re.I)

# (class, pattern searched in the error line, the error record's type and message). Order
# matters: the specific signatures first, so "RuntimeError: CUDA out of memory" is cuda_oom.
_CLASSES = [
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED")),
    ("nan_loss", re.compile(r"NonFiniteLossError|\bloss\b.{0,40}\b(nan|inf|non-?finite)\b|"
                            r"\b(nan|non-?finite)\b.{0,20}\bloss\b", re.I)),
    ("collective_timeout", re.compile(
        r"Watchdog caught collective operation timeout|Timed out waiting|ProcessGroupGloo.*time ?out|"
        r"ProcessGroupNCCL.*time ?out|collective operation timeout|DistStoreError.*Timed out|"
        r"Socket Timeout|wait timeout after", re.I)),
    # A GPU script on a node without one: a CPU-only torch build (no CUDA compiled in, no
    # NCCL built in) or a CUDA build that sees no device. Before cuda_mismatch, whose driver
    # messages overlap.
    ("needs_gpu", re.compile("|".join(_NO_CUDA_BUILD + _NO_DEVICE), re.I)),
    ("cuda_mismatch", re.compile(
        r"CUDA driver version is insufficient|libcudart\.so[\w.]*: cannot open|"
        r"no kernel image is available|CUDA error: forward compatibility", re.I)),
    # The code's model no longer fits the checkpoint it restores (runtime/restore_state.py).
    ("checkpoint_mismatch", re.compile(r"CheckpointMismatch")),
    ("missing_module", re.compile(r"ModuleNotFoundError|^ImportError|\bImportError:|No module named")),
    ("missing_file", re.compile(r"FileNotFoundError|No such file or directory")),
]
# An error that only reports that another rank went away first.
_ECHO = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*abort|Connection refused|"
    r"Read error \[|Socket closed", re.I)
# A Python exception line ("ValueError: x", "torch.OutOfMemoryError: y") or a known signature.
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt))(?::|\s*$)")
_PREEMPT = re.compile(r"\bpreempt", re.I)
_SUMMARY_FIELD = torch_private.SUMMARY_FIELD
_AGENT_CLOSED = torch_private.AGENT_CLOSED
_AGENT_DEATH = torch_private.AGENT_DEATH
_KERNEL_KILL = re.compile(r"(?:Killed process|oom-kill:.*?pid=)\s*(\d+)")
_SIGNAL_NAMES = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM", 7: "SIGBUS"}


@dataclass
class _Rank:
    rank: int
    node: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    record: dict = field(default_factory=dict)
    error: dict | None = None
    lines: list[str] = field(default_factory=list)
    log_mtime: float | None = None
    summary: dict | None = None  # this rank's block of its agent's failure summary

    @property
    def signal(self) -> int | None:
        code = self.exit_code
        if code is None:
            return None
        if code < 0:
            return -code
        return code - 128 if code in (128 + 6, 128 + 7, 128 + 9, 128 + 11, 128 + 15) else None


def _read_json(path: str) -> dict | None:
    """The document at `path` where it is an object (layout.read_json reads it)."""
    data = layout.read_json(path)
    return data if isinstance(data, dict) else None


def _read_lines(path: str, limit: int = TAIL_BYTES) -> list[str]:
    """The last `limit` bytes of a log as lines (a cut first line dropped; a capped log's
    dropped middle skipped, layout.read_log_lines)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    lines, _ = layout.read_log_lines(path, max(0, size - limit), limit)
    return lines[1:] if size > limit and lines else lines


def _parse_agent_log(lines: list[str]) -> dict[str, Any]:
    """torchrun's failure summary per global rank, the pids it stopped, and whether it was signalled."""
    failures: dict[int, dict] = {}
    block: dict | None = None
    for line in lines:
        if torch_private.SUMMARY_BLOCK_START.match(line):
            block = {}
            continue
        match = _SUMMARY_FIELD.match(line) if block is not None else None
        if not match:
            block = None if line.startswith(("---", "===", torch_private.SUMMARY_ROOT_CAUSE)) else block
            continue
        assert block is not None  # a field matched only inside a block
        block[match.group(1)] = match.group(2).strip()
        if match.group(1) == "traceback" and "rank" in block:
            rank = re.match(r"(\d+)", block["rank"])
            if rank and int(rank.group(1)) not in failures:
                failures[int(rank.group(1))] = _summary_entry(block)
            block = None
    closed = {int(a or b) for a, b in (m.groups() for m in map(_AGENT_CLOSED.search, lines) if m)}
    death = next((line.split("] ", 1)[-1] for line in lines if _AGENT_DEATH.search(line)), None)
    return {"failures": failures, "closed_pids": closed, "signalled": death}


def _summary_entry(block: dict) -> dict:
    exit_match = re.match(r"(-?\d+)\s*\(pid:\s*(\d+)\)", block.get("exitcode", ""))
    try:  # the agent writes local time, to the second
        when = time.mktime(time.strptime(block.get("time", ""), "%Y-%m-%d_%H:%M:%S"))
    except ValueError:
        when = None
    return {"exit_code": int(exit_match.group(1)) if exit_match else None,
            "pid": int(exit_match.group(2)) if exit_match else None,
            "time": when, "traceback": block.get("traceback", "")}


def _load(attempt_dir: str, rank_exits: dict,
          reported: list[dict] | None = None) -> tuple[dict[int, _Rank], dict[int, dict]]:
    ranks: dict[int, _Rank] = {}

    def get(rank: int) -> _Rank:
        return ranks.setdefault(rank, _Rank(rank))

    for rank, code in (rank_exits or {}).items():
        get(int(rank)).exit_code = code
    # What ranks reported over the route; a file in the attempt directory, where there is one,
    # replaces it below (the same record, written before it was sent).
    records, errors = reported_records(reported or [])
    for rank, record in records.items():
        get(rank).record = record
    for rank, error in errors.items():
        get(rank).error = error
    for path in glob.glob(os.path.join(attempt_dir, "rank-*.*")):
        match = re.match(r"rank-(\d+)\.(log|json|error\.json)$", os.path.basename(path))
        if not match:
            continue
        r = get(int(match.group(1)))
        if match.group(2) == "log":
            r.lines = _read_lines(path)
            r.log_mtime = os.path.getmtime(path)
        elif match.group(2) == "json":
            r.record = _read_json(path) or {}
        else:
            r.error = _read_json(path)
    agents: dict[int, dict] = {}
    for path in glob.glob(os.path.join(attempt_dir, "node-*.log")):
        match = re.match(r"node-(\d+)\.log$", os.path.basename(path))
        if match:
            agents[int(match.group(1))] = _parse_agent_log(_read_lines(path))
    for node, agent in agents.items():
        for rank, entry in agent["failures"].items():
            r = get(rank)
            r.summary = entry
            r.node = node if r.node is None else r.node
    for r in ranks.values():
        r.node = r.record.get("node", (r.error or {}).get("node", r.node))
        r.pid = r.record.get("pid") or (r.summary or {}).get("pid")
        if r.exit_code is None:  # the launcher did not see it: the agent or the bootstrap did
            r.exit_code = (r.summary or {}).get("exit_code", r.record.get("exit_code"))
    return ranks, agents


def _first_error_index(lines: list[str]) -> int | None:
    for i, line in enumerate(lines):
        # Indented lines are traceback frames and source ("    raise NonFiniteLossError(...)"):
        # they name an error without being one.
        if line[:1].isspace():
            continue
        if _EXCEPTION_LINE.match(line) or any(p.search(line) for _, p in _CLASSES):
            return i
    return None


def _oom_evidence(r: _Rank, info: dict) -> str | None:
    kernel = info.get("kernel_log") or ""
    for line in kernel.splitlines() if isinstance(kernel, str) else kernel:
        match = _KERNEL_KILL.search(line)
        if match and r.pid is not None and int(match.group(1)) == int(r.pid):
            return line.strip()
    if info.get("oom_kill"):
        return f"the node's memory cgroup counted {info['oom_kill']} OOM kill(s)"
    return None


def _examine(r: _Rank, agent: dict, info: dict) -> dict:
    """This rank's own failure: class, first error line and where it is, time, and whether it
    is only an echo of another rank's failure."""
    error = r.error or {}
    index = _first_error_index(r.lines)
    line = r.lines[index] if index is not None else ""
    if not line and error:
        line = f"{error.get('type')}: {error.get('message', '')}".splitlines()[0]
    # The first error line decides; the raised type only when that line says nothing known
    # (a FileNotFoundError that surfaced as an ImportError is a missing file).
    cls = next((name for text in (line, f"{error.get('type', '')}: {error.get('message', '')}")
                for name, pattern in _CLASSES if pattern.search(text)), None)
    sig = r.signal
    tail = "\n".join(r.lines[-CONTEXT_LINES:])
    # Preemption reaches a rank as SIGTERM: from its agent when the agent itself got one (the
    # node was preempted or stopped), or straight from the platform.
    preempted = bool(agent.get("signalled") or _PREEMPT.search(tail)
                     or "Preempt" in str(error.get("type", "")))
    stopped_by_agent = r.pid is not None and r.pid in agent.get("closed_pids", ())
    echo = bool(_ECHO.search(line)) and cls is None
    oom_line = None
    if cls is None and not error:
        if sig == 9:
            oom_line = _oom_evidence(r, info)
            # SIGKILLed by its own agent after ignoring the closing SIGTERM: not a cause.
            if stopped_by_agent and not oom_line:
                cls, echo = ("preempted", False) if preempted else ("unknown", True)
            else:
                cls = "host_oom"
        elif sig == 15:
            # Without preemption, a SIGTERM is the agent cleaning up after another rank failed.
            cls, echo = ("preempted", False) if preempted else ("unknown", True)
    elif cls is None and sig == 15 and preempted:
        cls = "preempted"
    if cls is None:
        cls = "user_exception" if error or _EXCEPTION_LINE.match(line) else "unknown"
    if index is None:
        # No error line of its own (a signal): the kernel's or the agent's words, and what the
        # rank was doing last.
        if cls == "preempted":
            line = agent.get("signalled") or next((x for x in reversed(r.lines) if _PREEMPT.search(x)), "")
        line = oom_line or line or (r.summary or {}).get("traceback") or (
            f"exit code {r.exit_code}" if r.exit_code is not None else "no exit code")
        context = r.lines[-CONTEXT_LINES:]
    else:
        context = r.lines[max(0, index - CONTEXT_LINES):index]
    when = error.get("t") or r.record.get("end") or (r.summary or {}).get("time") or r.log_mtime \
        or r.record.get("start")
    return {"class": cls, "line": line, "context": context, "time": when, "echo": echo,
            "oom_evidence": oom_line}


def _failed(r: _Rank) -> bool:
    return bool(r.error) or r.exit_code not in (0, None)


def diagnose(attempt_dir: str, rank_exits: dict, nodes_info: dict | None = None,
             reported: list[dict] | None = None) -> dict | None:
    """The first error of a failed attempt, or None when no rank failed.

    {"class", "rank", "node", "time", "line", "context", "suggestion", "exit_code",
     "same_ranks", "where"}: `same_ranks` are the other ranks that failed with the very same
    error line (shown once); `where` is the user's own file and line (or notebook cell and
    line), not our copy of the script, when the traceback reaches it.
    """
    ranks, agents = _load(attempt_dir, {int(k): v for k, v in (rank_exits or {}).items()}, reported)
    findings = {}
    for r in ranks.values():
        if _failed(r):
            node_info = (nodes_info or {}).get(r.node, (nodes_info or {}).get(str(r.node), {}))
            findings[r.rank] = _examine(r, agents.get(r.node, {}) if r.node is not None else {},
                                        node_info or {})
    if not findings:
        return _preempted_cleanly(ranks, agents)
    # Own failures before echoes; then by time; a rank without any time last.
    rank = min(findings, key=lambda k: (findings[k]["echo"], findings[k]["time"] is None,
                                        findings[k]["time"] or 0.0, k))
    found, r = findings[rank], ranks[rank]
    origin = source_origin(os.path.dirname(os.path.abspath(attempt_dir)))
    where = _user_frame((r.error or {}).get("traceback") or "\n".join(found["context"] + [found["line"]]),
                        origin)
    same = sorted(k for k, f in findings.items() if k != rank and not f["echo"]
                  and (f["class"], f["line"]) == (found["class"], found["line"]))
    return {"class": found["class"], "rank": rank, "node": r.node, "time": found["time"],
            "line": found["line"], "context": [origin.relocate(x) for x in found["context"]],
            "suggestion": _suggest(found, r, ranks, findings, where), "exit_code": r.exit_code,
            "same_ranks": same, "where": where}


def _preempted_cleanly(ranks: dict[int, _Rank], agents: dict[int, dict]) -> dict | None:
    """No rank failed on record, but an agent was signalled: a preemption. Our runtime answers
    SIGTERM with a checkpoint and exit 0; a plain script dies of it, often leaving no exit code
    anywhere (its agent died before summarising), so a rank that never recorded an end goes first."""
    node = next((k for k in sorted(agents) if agents[k]["signalled"]), None)
    on_node = [r for r in ranks.values() if r.node == node]
    if node is None or not on_node:
        return None
    first = min(on_node, key=lambda r: ("end" in r.record, r.record.get("end") or 0, r.rank))
    found = {"class": "preempted", "line": agents[node]["signalled"]}
    return {**found, "rank": first.rank, "node": node,
            "time": first.record.get("end") or first.log_mtime, "context": first.lines[-CONTEXT_LINES:],
            "suggestion": _suggest(found, first, ranks, {}), "exit_code": first.exit_code}


def _user_frame(traceback_text: str, origin: SourceOrigin | None = None) -> str | None:
    """The innermost frame outside Python, torch and our bootstrap: where to look, in the
    user's own terms (their file, or the notebook cell) when `origin` knows them."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', traceback_text or "")
    for path, line in reversed(frames):
        if not any(s in path for s in ("site-packages", "<frozen", "/lib/python", "jupyter_dlc/runtime")):
            return origin.place(path, int(line)) if origin else f"{path}:{line}"
    return None


def _suggest(found: dict, r: _Rank, ranks: dict[int, _Rank], findings: dict,
             where: str | None = None) -> str:
    cls, who, code, line = found["class"], f"rank {r.rank}", r.exit_code, found["line"]
    if cls == "needs_gpu":
        text = "\n".join([line, str((r.error or {}).get("message", "")), *found["context"]])
        why = ("its torch is a CPU-only build (torch.version.cuda is None)" if _NO_CUDA_BUILD_RE.search(text)
               else "no GPU is visible there (no device, no driver, or CUDA_VISIBLE_DEVICES hides them)")
        at = f" at {where}" if where else ""
        return (f"{who} needs a GPU the node does not have: {why}; the script uses CUDA or nccl{at}. "
                "Run it on GPU nodes, or on CPU use init_process_group('gloo') and drop "
                "torch.cuda.set_device and .cuda()/.to('cuda')")
    if cls == "host_oom":
        how = ("by the kernel's OOM killer" if found["oom_evidence"]
               else "by SIGKILL, most likely the kernel's OOM killer")
        return (f"{who} was killed {how} (exit {code}): reduce batch size, DataLoader num_workers "
                "or --nproc-per-node, or ask for more host memory")
    if cls == "cuda_oom":
        return (f"{who} ran out of GPU memory: lower the per-GPU batch size, use mixed precision or "
                "gradient accumulation; if reserved >> allocated in torch.cuda.memory_summary(), "
                "it is fragmentation")
    if cls == "collective_timeout":
        absent = sorted(k for k in ranks if k != r.rank and (k not in findings or findings[k]["echo"]))
        late = f"rank(s) {', '.join(map(str, absent))} never joined it" if absent else "another rank never joined it"
        return (f"{who} timed out in a collective: {late}; check that every rank runs the same "
                "collectives in the same order and none is stuck (data loading, a rank-only branch); "
                "rerun with --network debug for NCCL_DEBUG=INFO")
    if cls == "cuda_mismatch":
        return ("the CUDA runtime in the environment does not match the node's driver: install the "
                "torch build for the driver's CUDA version (nvidia-smi shows it) or use a matching image")
    if cls == "missing_module":
        name = re.search(r"No module named '([^']+)'", line)
        what = f"module '{name.group(1)}'" if name else "a module"
        return (f"{what} cannot be imported on the node: pip install it into the job's Python, "
                "or put its folder on PYTHONPATH with --env")
    if cls == "missing_file":
        path = re.search(r"No such file or directory: '([^']+)'", line)
        what = f"'{path.group(1)}'" if path else "a file"
        return (f"{who} could not open {what}: relative paths resolve from the job's workdir on "
                "each node; use an absolute path on storage every node can read")
    if cls == "nan_loss":
        return (f"the loss became non-finite on {who}: lower the learning rate, clip gradients, check "
                "the inputs for NaN, prefer bf16 or a GradScaler; resume from the last checkpoint")
    if cls == "preempted":
        return ("the job was stopped by SIGTERM (preemption or a stop request): resume it; it "
                "continues from the last committed checkpoint")
    if cls == "checkpoint_mismatch":
        return (f"{who}'s code no longer fits the checkpoint it restores{f' (at {where})' if where else ''}: "
                "the line above names the keys. For a new or reshaped layer restore with "
                "ckpt.restore(strict=False); add --fresh-optimizer to restore the weights only; "
                "or undo the change")
    if cls == "user_exception":
        kind = (r.error or {}).get("type") or line.split(":")[0].strip()
        return f"{who} raised {kind}{f' at {where}' if where else ''}: fix it there and resume or clone the job"
    sig = r.signal
    how = f"signal {_SIGNAL_NAMES.get(sig, sig)}" if sig else f"exit code {code}"
    return f"{who} ended with {how} and no Python error: read the end of its log (rank-{r.rank}.log)"


def diagnose_hang(attempt_dir: str, reason: str, laggards: list[int], stacks: dict[int, dict],
                  nproc_per_node: int) -> dict:
    """A progress verdict's diagnosis, from the stacks the ranks sent when asked
    (runtime/stacks.py). In a hang most ranks wait in the same collective for the few that
    never got there; those few are the story. So the rank shown is one whose last step is
    behind the others' (`laggards`), else one from the smallest group of ranks stopped at
    the same place, and `where` is its innermost frame of the user's own code."""
    origin = source_origin(os.path.dirname(os.path.abspath(attempt_dir)))
    places = {r: _user_frame(s.get("main") or "", origin) for r, s in stacks.items()}
    groups: dict[str | None, list[int]] = {}
    for r in sorted(places):
        groups.setdefault(places[r], []).append(r)
    if laggards:
        rank: int | None = laggards[0]
    elif groups:
        # The ranks inside a collective wait for the others: prefer a rank that is not.
        waiting = {r: _in_collective(stacks[r].get("main") or "") for r in stacks}
        rank = min(groups.values(), key=lambda g: (all(waiting[r] for r in g), len(g), g[0]))[0]
    else:
        rank = None
    main = (stacks.get(rank) or {}).get("main") or "" if rank is not None else ""
    where = places.get(rank) if rank is not None else None
    if not stacks:
        suggestion = ("no rank sent its stacks: a rank blocked in C code with the GIL held "
                      "cannot answer; `py-spy dump --pid PID` on the node shows where it is")
    elif len(groups) > 1:
        elsewhere = "; ".join(f"rank{'s' if len(g) > 1 else ''} {number_list(g)} at {p or 'no frame of yours'}"
                              for p, g in groups.items() if rank not in g)
        suggestion = (f"rank {rank} stopped at {where or 'no frame of yours'} while {elsewhere}: "
                      "the ranks waiting in a collective wait for it")
    else:
        suggestion = (f"every rank stopped at {where or 'no frame of yours'}: a collective that "
                      "some rank entered with another shape or order, or a peer that cannot be "
                      "reached (check NCCL/GLOO_SOCKET_IFNAME)")
    return {"class": "hang", "rank": rank, "node": rank // nproc_per_node if rank is not None else None,
            "time": time.time(), "line": reason, "exit_code": None,
            "context": [origin.relocate(x) for x in main.rstrip().splitlines()[-CONTEXT_LINES:]],
            "same_ranks": [r for r in groups.get(where, []) if r != rank] if where else [],
            "where": where, "suggestion": suggestion}


def _in_collective(stack: str) -> bool:
    """Whether a stack's innermost frames are torch.distributed's (a collective, a barrier,
    a store wait): such a rank waits for a peer rather than being the one stuck."""
    frames = re.findall(r'File "([^"]+)"', stack)
    return any("/torch/distributed/" in path for path in frames[-3:])


def number_list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
