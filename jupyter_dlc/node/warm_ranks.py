"""Rank processes forked from a standby agent that has already imported torch.

A restart used to pay a whole interpreter start per rank: torchrun's agent execs
`python -m jupyter_dlc.runtime.bootstrap`, which imports torch, and the first DDP
construction then imports torch._dynamo and sympy (seconds, most of a recovery). A standby
agent (standby.py) instead imports all that while the failed attempt still trains, then
forks one child per local rank while it is the only thread of its process. Each child waits
on a pipe. When the restart comes, torchrun's agent in the standby starts its workers through
`torch_private.route_worker_starts`: each worker is one of these children, handed its argv
and environment over the pipe, so a restarted rank costs a fork, not a cold start.

It is still a fresh process per rank and attempt: forked before any process group, thread,
CUDA context or user code existed, in a session of its own, with exactly the environment
torchrun gives a worker and RNGs seeded afresh as a new interpreter's are. The children are the
agent's own, so torchrun reaps them as it does its Popen workers; and the agent writes the
exit of a worker killed by a signal into its rank record at once (the bootstrap, killed,
cannot), which is how the launcher learns of the death within one tick.
A child whose pipe closes without an order (the standby was not needed) exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback

from .. import layout
from ..shims import torch_private

# What the standby imports before it forks: torch, what DDP and FSDP import on first use,
# the runtime and what its first log() imports (TensorBoard's writer on rank 0, the system
# samplers). A module that is not installed is skipped.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
           "torch.distributed.fsdp", "torch.distributed.tensor", "jupyter_dlc.runtime",
           "torch.utils.tensorboard", "psutil", "pynvml")
# What a cold start's agent imports before it forks (standby.py --cold): torch, what DDP's
# first construction imports (torch._dynamo and sympy: a second or more a rank) and the
# runtime; not TensorBoard, FSDP or DTensor, which a job may never use and which would then
# cost its start instead of a rank's first use.
COLD_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                "jupyter_dlc.runtime", "psutil")
# How torchrun starts every worker of a launcher job (engines/torchrun.py torchrun_argv).
WORKER_ARGV = ("-u", "-m", "jupyter_dlc.runtime.bootstrap")
_POLL = 0.01


# torch.cuda.is_available() (which imports may call) asks NVML instead of initialising the
# CUDA driver, which a forked child could not use (torch documents the variable).
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    previous = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    try:
        for name in modules:
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - an optional part of torch: the rank imports it if used
                pass
    finally:  # not for the workers, whose environment is the agent's plus torchrun's
        if previous is None:
            os.environ.pop(_NVML_CHECK, None)
        else:
            os.environ[_NVML_CHECK] = previous


def fork_ranks(count: int) -> list[WarmRank]:
    """`count` waiting children, or none where forking is not safe here: another Python
    thread (a lock it holds would stay held in the child) or a CUDA driver already loaded
    (its state does not survive a fork); the restart then starts its ranks cold."""
    torch = sys.modules.get("torch")
    if threading.active_count() != 1 or _cuda_driver_loaded() or \
            (torch is not None and torch.cuda.is_initialized()):
        return []
    sys.stdout.flush()  # or a child would write the agent's buffered output once more
    sys.stderr.flush()
    ranks: list[WarmRank] = []
    for _ in range(count):
        ranks.append(WarmRank.fork([r.order_fd for r in ranks]))
    return ranks


def route(ranks: list[WarmRank]) -> None:
    """Have torchrun's agent in this process start its workers on `ranks`, in order; any
    worker beyond them, or started another way, gets torchrun's own Popen."""
    free = list(ranks)

    def start(args, env, stdout, stderr):
        if not free or args[0] != sys.executable or tuple(args[1:4]) != WORKER_ARGV:
            return None
        return free.pop(0).hand(list(args[4:]), env, stdout, stderr)

    torch_private.route_worker_starts(start)


def _cuda_driver_loaded() -> bool:
    """Whether this process has loaded the CUDA driver library (any CUDA call does)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return True  # cannot tell: do not fork


class WarmRank:
    """A forked child waiting for its order; `hand` makes it a worker."""

    def __init__(self, pid: int, order_fd: int):
        self.pid = pid
        self.order_fd = order_fd

    @classmethod
    def fork(cls, siblings: list[int]) -> WarmRank:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            # Only the agent may hold a write end, or a child would never see its pipe close.
            for fd in (write_fd, *siblings):
                os.close(fd)
            _wait_for_order(read_fd)  # never returns
        os.close(read_fd)
        return cls(pid, write_fd)

    def hand(self, argv: list[str], env: dict[str, str], stdout, stderr) -> ForkedWorker:
        order = {"argv": argv, "env": env,
                 "stdout": getattr(stdout, "name", None), "stderr": getattr(stderr, "name", None)}
        with os.fdopen(self.order_fd, "w") as pipe:
            json.dump(order, pipe)
        # In the node log: the moment torchrun's rendezvous was done and this rank began.
        print(f"jupyter_dlc: rank {env.get('RANK')} handed to forked process {self.pid} "
              f"at {time.time():.3f}", file=sys.stderr, flush=True)
        return ForkedWorker(self.pid, [sys.executable, *WORKER_ARGV, *argv], env)


class ForkedWorker:
    """What torchrun's agent uses of a `subprocess.Popen`, for a forked child."""

    def __init__(self, pid: int, args: list[str], env: dict[str, str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        attempt_dir = env.get("DLC_ATTEMPT_DIR")
        self._record = (layout.rank_json(attempt_dir, int(env["RANK"]))
                        if attempt_dir and env.get("RANK", "").isdigit() else None)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost, call it failed
                pid, status = self.pid, 1 << 8
            if pid:
                # Popen's convention, which torchrun's summary reports: -N for signal N.
                self.returncode = os.waitstatus_to_exitcode(status)
                if self.returncode < 0:
                    self._record_death(128 - self.returncode)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, float(timeout or 0))
            time.sleep(_POLL)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def _record_death(self, code: int) -> None:
        """A worker killed by a signal never records its own exit: record it for it."""
        if self._record is None:
            return
        try:
            with open(self._record) as f:
                record = json.load(f)
            if record.get("exit_code") is None and record.get("pid") == self.pid:
                record.update(end=time.time(), exit_code=code)
                layout.write_json(self._record, record)
        except (OSError, ValueError):
            pass  # no record yet: the launcher's scan still finds the pid gone


def _wait_for_order(read_fd: int) -> None:
    """In the child: block until the agent hands over a worker's argv and environment (or
    closes the pipe unused), then run the bootstrap as `python -m` would have."""
    code = 0
    try:
        os.setsid()  # torchrun signals a worker's process group, as with start_new_session
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        if not data:
            return  # the standby left, or was not needed
        order = json.loads(data)
        code = 1
        os.environ.clear()
        os.environ.update(order["env"])
        for fd, path in ((1, order["stdout"]), (2, order["stderr"])):
            if path:
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(target, fd)
                os.close(target)
        as_a_fresh_process()
        from ..runtime import bootstrap

        sys.argv = list(order["argv"])
        bootstrap.main(order["argv"])  # leaves with os._exit
    except BaseException:  # noqa: BLE001 - a child must never return into the agent's code
        traceback.print_exc()
    finally:
        os._exit(code)


def as_a_fresh_process() -> None:
    """What a new interpreter would have that a fork shares with its parent and siblings:
    torch's and numpy's global RNGs seeded from the OS, as their import seeds them (Python's
    `random` reseeds itself at fork), and torch's intra-op threads as the worker's
    OMP_NUM_THREADS says (torchrun sets 1; OpenMP read the agent's environment when torch
    was imported)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
