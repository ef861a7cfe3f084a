"""One node of a warm pool: a zygote that has imported torch and forks each job's ranks.

    python -m jupyter_dlc.node.pool_agent POOL_DIR NODE

Why a zygote: a rank's cold start is mostly `import torch` (about 1 s of CPU a rank here,
several seconds for four ranks on two cores). This process pays it once, then for each job
forks a fresh *node process* that forks the job's ranks. Nothing a job does reaches the next
one: the zygote never runs user code, never starts a thread (OMP_NUM_THREADS=1, so neither
OpenMP nor OpenBLAS start pools at import) and never touches CUDA, so every rank is a clean
copy of "Python with torch imported" with no global state, no CUDA context and no process
group. Node 0 also forks a *store keeper* that holds the next job's TCPStore already
listening (torchrun's agent store: `TORCHELASTIC_USE_AGENT_STORE=True`), one fresh store per
job so that no key of an earlier job is ever seen.

Files in POOL_DIR (written atomically by rename):
    lease               touched by the launcher every tick; older than the lease, we leave
    node-K.pid          {"pid", "keeper"?}: this agent is ready
    node-K.order        a job for this node (the launcher writes it; we delete it on reading,
                        since it holds the attempt's token)
    node-K.ack          {"seq", "pid"}: the node process of order `seq` runs as `pid`
    store-ready.json    {"seq", "port"}: the store that job `seq` will use is listening
    store-claim         the seq of the job that took the ready store

Files of a pooled job's node process in the attempt's directory (shared with the launcher):
    node-K.exit         the node's exit code, as torchrun's wrapper writes it
    node-K.alive        {"host", "pid", "t"}, refreshed every second while the ranks run
    node-K.signal       {"signal": TERM|KILL}: the launcher's stop/kill order, carried out here on the
                        ranks' process groups (the launcher may be on another host)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time

from .. import layout
from . import reporter as node_reporter
from .warm_ranks import as_a_fresh_process

_POLL = 0.01
_NODE_POLL = 0.05  # a node process's look at its ranks and the launcher's orders
_PR_SET_PDEATHSIG = 1  # prctl(2)
ALIVE_INTERVAL = 1.0  # how often a node process refreshes node-K.alive
LEASE_SECONDS = float(os.environ.get("DLC_POOL_LEASE", "60"))


def _lease_expired(pool_dir: str) -> bool:
    try:
        return time.time() - os.stat(os.path.join(pool_dir, "lease")).st_mtime > LEASE_SECONDS
    except OSError:
        return True  # the pool was released (its directory removed)


# -- the store keeper (node 0) ------------------------------------------------------------
def store_keeper(pool_dir: str) -> None:
    """Keep one TCPStore listening for the next job; a claimed one lives until the job after
    it claims (one job at a time per pool, so by then its job has ended)."""
    import torch.distributed as dist

    servers: dict[int, object] = {}
    ready = 1
    claim_path = os.path.join(pool_dir, "store-claim")

    def open_store(seq: int) -> None:
        store = dist.TCPStore("0.0.0.0", 0, None, True, wait_for_workers=False)
        servers[seq] = store
        layout.write_json(os.path.join(pool_dir, "store-ready.json"), {"seq": seq, "port": store.port})

    open_store(ready)
    while not _lease_expired(pool_dir):
        try:
            with open(claim_path) as f:
                claimed = int(f.read().strip() or 0)
        except (OSError, ValueError):
            claimed = 0
        if claimed >= ready:
            for seq in [s for s in servers if s < claimed]:
                del servers[seq]  # its job has ended: the next one claimed after it
            ready = claimed + 1
            open_store(ready)
        time.sleep(_POLL)


# -- a job's node process -----------------------------------------------------------------
def _mark_environ_block(env: dict[str, str]) -> None:
    """Make /proc/self/environ show this job's id and attempt.

    The launcher finds a job's processes by `DLC_JOB_ID`/`DLC_ATTEMPT` in
    /proc/<pid>/environ (engines/local/engine.py). That file shows the block the kernel copied at
    exec (proc(5): env_start..env_end), which a fork inherits and `setenv` never changes. The
    C environment is first rebuilt from os.environ (fresh strings), so nothing points into
    the block any more, and then the block is overwritten with the job's markers; the agent
    was started with padding (DLC_POOL_ROOM) so that they always fit."""
    fields = open("/proc/self/stat", "rb").read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # proc(5) fields 50 and 51
    text = "".join(f"{k}={env[k]}\0" for k in ("DLC_JOB_ID", "DLC_ATTEMPT", "DLC_NODE_RANK")
                   if k in env).encode()
    if not start or end - start < len(text):
        return
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)


def _enter(order: dict, env: dict[str, str]) -> None:
    """Become a process of the job: its cgroup, its environment, its directory."""
    if order.get("cgroup"):
        try:
            with open(os.path.join(order["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    saved = dict(os.environ)
    os.environ.clear()  # unsetenv each: the C environment no longer uses the exec block
    os.environ.update(env)
    del saved
    _mark_environ_block(env)


def _job_env(order: dict) -> dict[str, str]:
    """The job's variables for this node; inside a Slurm allocation also the allocation's
    own (SLURM_JOB_ID...), without the step's, as the Slurm engine's cold start gives them."""
    return _ALLOCATION_ENV | dict(order["env"], DLC_NODE_RANK=str(order["node"]))


def _allocation_env() -> dict[str, str]:
    """Taken once in the zygote, whose environment its forks replace with each job's."""
    if os.environ.get("DLC_POOL_ENGINE") != "slurm":
        return {}
    from .slurm_node import STEP_VARS

    return {k: v for k, v in os.environ.items() if k.startswith("SLURM_") and k not in STEP_VARS}


_ALLOCATION_ENV: dict[str, str] = {}
# The node's name as Slurm knows it (as reasons name nodes), else the host's.
_NODE_NAME = os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def run_rank(order: dict, local_rank: int) -> None:
    """In a forked rank: what torchrun's agent gives a worker, then the bootstrap."""
    node, nproc = order["node"], order["nproc_per_node"]
    rank = node * nproc + local_rank
    world = order["nnodes"] * nproc
    env = _job_env(order)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(node),
        "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc),
        "WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(order["nnodes"]),
        "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": order["master_addr"],
        "MASTER_PORT": str(order["master_port"]), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    os.setsid()  # torchrun starts each worker in a session of its own; so do we
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _enter(order, env)
    os.chdir(order["cwd"])
    # `python -m bootstrap` in cwd would have cwd first on sys.path, then PYTHONPATH.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.getcwd(), *extra]
    # A fork shares the zygote's RNG seeds (every rank of every job would draw the same
    # numbers) and its thread count (libgomp read "1" when the zygote loaded it).
    as_a_fresh_process()
    from ..runtime import bootstrap

    bootstrap.main([order["script"], *order["args"]])


def run_node(order: dict) -> int:
    """In a forked node process: fork the node's ranks, wait for them, record the exit as the
    torchrun agent's wrapper does (node-K.exit), and fill in the exit of a rank killed by a
    signal, which has no chance to write its own record."""
    env = _job_env(order)
    os.setsid()
    _enter(order, env)
    # A stop's SIGTERM is for the ranks (they checkpoint and leave); this process outlives
    # them through the grace to record their exits, as torchrun's wrapper shell does. A
    # handler, not an ignore: the ranks forked below set theirs back to the default.
    signal.signal(signal.SIGTERM, lambda *_: None)
    log = os.open(order["node_log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # The node's ranks report through one node reporter, in this process: it listens (and its
    # URL is where the ranks look) before they are forked, and answers once they are, since
    # no thread may run across a fork. It outlives the ranks, as this process does.
    reporter = server = None
    reporter_file = node_reporter.url_file(order["attempt_dir"], order["node"])
    if node_reporter.wanted(order["nproc_per_node"]) and env.get("DLC_LAUNCHER_URL"):
        reporter, server = node_reporter.from_env(env, start=False)
        node_reporter.publish(server, reporter_file)
        order["env"] = dict(order["env"], **{node_reporter.ENV: reporter_file})
    ranks: dict[int, int] = {}
    parent = os.getpid()
    for local_rank in range(order["nproc_per_node"]):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if server:  # else the port would still take connections once this node is gone
                    server.socket.close()
                _die_with_parent(parent)
                run_rank(order, local_rank)  # leaves with os._exit
            except BaseException:  # noqa: BLE001 - a rank must never return into this loop
                import traceback

                traceback.print_exc()
            os._exit(code)
        ranks[pid] = order["node"] * order["nproc_per_node"] + local_rank
    if reporter and server:
        reporter.start()
        node_reporter.start_serving(server)
    print(f"pool node {order['node']}: ranks {sorted(ranks.values())} started as {sorted(ranks)}",
          flush=True)
    worst = 0
    signal_path = os.path.join(order["attempt_dir"], f"node-{order['node']}.signal")
    alive_path = os.path.join(order["attempt_dir"], f"node-{order['node']}.alive")
    obeyed, beat = "", 0.0
    while ranks:
        # The launcher may run on another host: it neither sees these pids nor can signal
        # them, so it leaves an order (TERM, then KILL) in the shared attempt directory and
        # this process, which owns the ranks, carries it out; and it shows it is alive.
        if time.monotonic() - beat >= ALIVE_INTERVAL:
            beat = time.monotonic()
            layout.write_json(alive_path, {"host": _NODE_NAME, "pid": os.getpid(), "t": time.time()})
        wanted = _read_order(signal_path)
        if wanted and wanted != obeyed:
            obeyed = wanted
            _signal_ranks(list(ranks), signal.SIGKILL if wanted == "KILL" else signal.SIGTERM)
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            time.sleep(_NODE_POLL)
            continue
        rank = ranks.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N
        record_path = os.path.join(order["attempt_dir"], f"rank-{rank}.json")
        record = layout.read_json(record_path) or {"rank": rank, "pid": pid}
        if record.get("exit_code") is None:
            record.update(exit_code=code, end=time.time())
            layout.write_json(record_path, record)
        if code and not worst:
            worst = code
            print(f"pool node {order['node']}: rank {rank} exited with code {code}", flush=True)
    exit_code = 1 if worst else 0  # as torchrun's agent: 1 when any worker failed
    if server:
        with contextlib.suppress(OSError):
            os.unlink(reporter_file)
    with open(order["exit_file"], "w") as f:
        f.write(str(exit_code))
    return exit_code


def _die_with_parent(parent: int) -> None:
    """A rank whose node process is gone has nobody left to carry out the launcher's orders
    or record its exit (the launcher may be on another host): the kernel kills it then."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _read_order(path: str) -> str:
    return (layout.read_json(path) or {}).get("signal") or ""


def _signal_ranks(pids: list[int], sig: int) -> None:
    """Each rank leads a session and process group of its own (setsid): the signal reaches
    what the rank started too (data loader workers), as torchrun's agent does."""
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # forked, not yet in a group of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


# -- the zygote ---------------------------------------------------------------------------
def main(pool_dir: str, node: int) -> int:
    import torch.distributed.run  # noqa: F401 - what scripts and the runtime use at start

    # The cost this process exists to pay once, as a standby agent pays it: torch, and what
    # DDP's first construction imports (torch._dynamo, sympy: a second of CPU a rank here,
    # which every warm job's first DDP paid in each of its ranks before this).
    from .warm_ranks import preload

    preload()

    from ..runtime import bootstrap  # noqa: F401
    from ..runtime import checkpoint, report  # noqa: F401

    global _ALLOCATION_ENV
    _ALLOCATION_ENV = _allocation_env()
    keeper = None
    if node == 0:
        keeper = os.fork()  # before any thread: the keeper's store threads stay its own
        if keeper == 0:
            code = 0
            try:
                store_keeper(pool_dir)
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            os._exit(code)
    layout.write_json(os.path.join(pool_dir, f"node-{node}.pid"),
                {"pid": os.getpid(), "keeper": keeper, "host": _NODE_NAME,
                 "addr": os.environ.get("DLC_POOL_ADDR") or "127.0.0.1"})
    order_path = os.path.join(pool_dir, f"node-{node}.order")
    while not _lease_expired(pool_dir):
        _reap()
        if os.path.exists(order_path):
            order = layout.read_json(order_path)
            os.unlink(order_path)
            if order is None:
                continue
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run_node(order)
                except BaseException:  # noqa: BLE001
                    import traceback

                    traceback.print_exc()
                sys.stdout.flush()
                os._exit(code)
            layout.write_json(os.path.join(pool_dir, f"node-{node}.ack"), {"seq": order["seq"], "pid": pid})
            continue
        time.sleep(_POLL)
    if keeper:
        os.kill(keeper, signal.SIGKILL)
    return 0


def _reap() -> None:
    """Collect ended node processes (children of this zygote) so none stays a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1], int(sys.argv[2])))
