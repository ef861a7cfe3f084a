"""Each private API behind jupyter_dlc/shims/ still exists and behaves as the shim assumes.

When an upgrade of torch, Python, ipykernel or jupyter_bokeh moves one, the test named after
it fails and says which shim to update. Real libraries, a real torchrun and a real process
group throughout.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_dlc.shims import bokeh_private, jupyter_private, python_private, torch_private

REPO = Path(__file__).resolve().parents[1]
# How the gloo scripts below end: a group left up can abort the interpreter at its exit
# ("terminate called without an active exception", rc -6, after "ok" was printed: CI of
# 2026-12-07; ../shared/FIELD-NOTES.md has the same crash in gloo jobs). The group is destroyed
# and the process leaves at once, output flushed, as FIELD-NOTES found reliable.
SAY_OK_AND_LEAVE = 'import os; dist.destroy_process_group(); print("ok", flush=True); os._exit(0)'


def _moved(shim: str, what: str) -> str:
    return f"{what} moved in the installed version: update jupyter_dlc/shims/{shim}.py"


# -- torch ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def torchrun_failure(tmp_path_factory):
    """A real torchrun of 2 workers: rank 1 dies by SIGKILL, rank 0 waits to be closed."""
    base = tmp_path_factory.mktemp("torchrun")
    script = base / "w.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        # One write(2) per line: print() writes its pieces apart, and the two workers'
        # pieces then interleave on the shared pipe ("agent store:agent store:  TrueTrue").
        os.write(1, f"agent store: {os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}\\n".encode())
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                           "--nproc-per-node", "2", "--master-port", str(_free_port()), str(script)],
                          cwd=base, capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


def test_torch_failure_summary_text(torchrun_failure):
    text = torchrun_failure
    assert torch_private.SUMMARY_ROOT_CAUSE in text, _moved("torch_private", "torchrun's summary header")
    found = torch_private.SUMMARY_RANK_EXIT.findall(text)
    assert ("1", "-9") in found, _moved("torch_private", "the summary's rank/exitcode block") + "\n" + text
    lines = text.splitlines()
    assert any(torch_private.SUMMARY_BLOCK_START.match(x) for x in lines), _moved("torch_private", "[N]:")
    fields = {m.group(1) for m in map(torch_private.SUMMARY_FIELD.match, lines) if m}
    assert {"rank", "exitcode", "traceback"} <= fields, _moved("torch_private", "the summary's fields")
    assert any(torch_private.AGENT_CLOSED.search(x) for x in lines), _moved("torch_private", "closing signal")


def test_torch_agent_death_signal_text():
    from torch.distributed.elastic.agent.server import api

    source = inspect.getsource(api)
    sample = next((line for line in source.splitlines() if "death signal" in line), "")
    assert torch_private.AGENT_DEATH.search(sample.replace("%s", "SIGTERM")), \
        _moved("torch_private", "the agent's death-signal line")


def test_torch_agent_store_variable(torchrun_failure):
    assert "agent store: True" in torchrun_failure, _moved("torch_private", torch_private.AGENT_STORE_ENV)


def test_torch_worker_starts_can_be_routed(tmp_path):
    """torchrun's agent starts workers in SubprocessHandler._popen: route_worker_starts sees
    each worker's argv and environment and may answer its own Popen-like object. (In a
    child interpreter: the route is process-wide.)"""
    code = textwrap.dedent("""
        import json, subprocess, sys
        from torch.distributed.elastic.multiprocessing.subprocess_handler import get_subprocess_handler
        from jupyter_dlc.shims import torch_private
        seen = []
        def start(args, env, stdout, stderr):
            seen.append([list(args), env.get("RANK"), stdout is None])
            return "ours" if env.get("RANK") == "1" else None
        torch_private.route_worker_starts(start)
        own = get_subprocess_handler(sys.executable, ("-c", "pass"), {"RANK": "0"}, "", "", 0)
        routed = get_subprocess_handler(sys.executable, ("-c", "pass"), {"RANK": "1"}, "", "", 1)
        assert own.proc.wait(30) == 0 and routed.proc == "ours"
        print(json.dumps(seen))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, _moved("torch_private", "SubprocessHandler._popen") + out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == [[[sys.executable, "-c", "pass"], "0", True], [[sys.executable, "-c", "pass"], "1", True]]


def test_torch_default_store_and_ddp_reducer_internals(tmp_path):
    """In a fresh Python: a gloo group of one, its default store, and DDP's reducer layout
    read, rebuilt and installed."""
    code = textwrap.dedent("""
        import torch, torch.nn as nn, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from jupyter_dlc.shims import torch_private as tp
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        store = tp.default_store()
        store.set("k", "v")
        assert store.get("k") == b"v"
        net = lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        ddp = DDP(net())
        assert tp.layout_blocker(ddp) is None
        assert tp.bucket_layout(ddp) is None          # no iteration yet: nothing rebuilt
        ddp(torch.randn(2, 4)).sum().backward()
        layout = tp.bucket_layout(ddp)
        assert sorted(i for b in layout for i in b) == [0, 1, 2, 3], layout
        other = DDP(net())
        tp.install_bucket_layout(other, layout)
        assert tp.reducer_buckets(other) == layout
        other(torch.randn(2, 4)).sum().backward()
        print("ok")
        """).replace('print("ok")', SAY_OK_AND_LEAVE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "ok" in proc.stdout, \
        _moved("torch_private", "_get_default_store or DDP's reducer internals") + "\n" + proc.stderr



class _CountingSection:
    def __init__(self):
        self.entered = self.left = 0

    def __enter__(self):
        self.entered += 1

    def __exit__(self, *exc):
        self.left += 1


@pytest.mark.parametrize("workers", [0, 1])
def test_torch_dataloader_next_is_the_base_iterators(workers):
    """Every DataLoader iterator's __next__ is _BaseDataLoaderIter's (the step breakdown's
    data wait wraps it there), single and multi-process alike."""
    import torch
    from torch.utils.data import DataLoader

    base = torch_private.dataloader_iterator_class()
    assert "__next__" in base.__dict__, _moved("torch_private", "_BaseDataLoaderIter.__next__")
    section = _CountingSection()

    def wrap(original):
        def timed(iterator):
            with section:
                return original(iterator)
        return timed

    torch_private.time_dataloader_next(wrap)
    try:
        torch_private.time_dataloader_next(wrap)  # idempotent: wrapped once
        batches = list(DataLoader(torch.arange(6), batch_size=2, num_workers=workers))
        iterator = iter(DataLoader(torch.arange(2), num_workers=workers))
        assert isinstance(iterator, base) and "__next__" not in type(iterator).__dict__, \
            _moved("torch_private", f"{type(iterator).__name__} overrides __next__")
        del iterator
    finally:
        torch_private.untime_dataloader_next()
    assert len(batches) == 3
    # Three batches and the StopIteration that ends the loop.
    assert (section.entered, section.left) == (4, 4), _moved("torch_private", "DataLoader's __next__")
    list(DataLoader(torch.arange(4), batch_size=2))
    assert section.entered == 4  # untimed again


def test_torch_ddp_sync_timing_hook(tmp_path):
    """In a fresh Python, a gloo group of one: a DDP built after time_ddp_sync reduces through
    the timing hook (GradBucket.is_last marks one bucket an iteration, gradients as DDP's
    own), a user's register_comm_hook and DDP's built-in one run inside it, and a bucket
    layout installed on restore keeps it."""
    code = textwrap.dedent("""
        import torch, torch.nn as nn, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from jupyter_dlc.shims import torch_private as tp
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

        class Clock:
            def __init__(self):
                self.launched_n, self.last, self.done_n = 0, 0, 0
            def launched(self, bucket):
                self.launched_n += 1
                self.last += bucket.is_last()
                return "token"
            def done(self, token):
                assert token == "token"
                self.done_n += 1
        clocks = []
        tp.time_ddp_sync(lambda ddp: clocks.append(Clock()) or clocks[-1])
        tp.time_ddp_sync(lambda ddp: 1 / 0)  # idempotent
        def net():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 300), nn.Tanh(), nn.Linear(300, 1))
        x = torch.randn(2, 4)
        timed = DDP(net(), bucket_cap_mb=0.001)
        for _ in range(2):  # the second iteration runs in the rebuilt buckets: several
            timed(x).sum().backward()
        clock = clocks[0]
        assert clock.launched_n == clock.done_n >= 3 and clock.last == 2, vars(clock)
        assert tp.layout_blocker(timed) is None
        tp.untime_ddp_sync()
        plain = DDP(net(), bucket_cap_mb=0.001)
        for _ in range(2):
            plain(x).sum().backward()
        assert len(clocks) == 1
        for a, b in zip(timed.parameters(), plain.parameters()):
            assert torch.equal(a.grad, b.grad)

        tp.time_ddp_sync(lambda ddp: clocks.append(Clock()) or clocks[-1])
        called = []
        def user_hook(state, bucket):
            called.append(state)
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
        hooked = DDP(net())
        hooked.register_comm_hook("mine", user_hook)
        hooked(x).sum().backward()
        assert called and set(called) == {"mine"} and clocks[1].done_n == len(called)
        assert tp.layout_blocker(hooked)  # the user's hook is DDP's record, as before
        builtin = DDP(net())
        builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        builtin(x).sum().backward()
        assert clocks[2].done_n >= 1

        layout = tp.bucket_layout(timed)
        restored = DDP(net(), bucket_cap_mb=0.001)
        tp.install_bucket_layout(restored, layout)
        restored(x).sum().backward()
        assert clocks[3].done_n == clocks[3].launched_n >= 2, vars(clocks[3])  # the new reducer's too
        print("ok")
        """).replace('print("ok")', SAY_OK_AND_LEAVE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "ok" in proc.stdout, \
        _moved("torch_private", "DDP's comm hook internals") + "\n" + proc.stderr

def test_torch_cpu_ddp_sync_timed_around_ddps_finalisation(tmp_path):
    """In a fresh Python, a gloo group of one: with `on_cpu`, a CPU DDP built after
    time_ddp_sync gets no comm hook; its exposed reduction is timed by two autograd final
    callbacks around DDP's finalisation (`Variable._execution_engine.queue_callback`, queued
    from a post-accumulate-grad hook on the first parameter, whose gradient is the backward's
    last). A user's comm hook whose future completes 80 ms late makes DDP's finalisation
    wait that long: the time measured says our first callback ran before DDP's and the
    second after it. One value a backward; a removed handle stops them."""
    code = textwrap.dedent("""
        import threading, torch, torch.nn as nn, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from jupyter_dlc.shims import torch_private as tp
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        seen = []
        tp.time_ddp_sync(lambda ddp: 1 / 0, on_cpu=seen.append)
        def net():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 300), nn.Tanh(), nn.Linear(300, 1))
        x = torch.randn(2, 4)
        timed = DDP(net(), bucket_cap_mb=0.001)
        for _ in range(3):
            timed(x).sum().backward()
        assert len(seen) == 3 and all(0 <= s < 5 for s in seen), seen
        def late(state, bucket):
            fut = torch.futures.Future()
            threading.Timer(0.08, fut.set_result, [bucket.buffer()]).start()
            return fut
        timed.register_comm_hook(None, late)
        timed(x).sum().backward()
        assert 0.07 <= seen[-1] < 5, seen
        with timed.no_sync():
            timed(x).sum().backward()
        assert len(seen) == 5 and seen[-1] < 0.05, seen  # no reduction to wait for
        restored = DDP(net(), bucket_cap_mb=0.001)
        tp.install_bucket_layout(restored, tp.bucket_layout(timed))
        restored(x).sum().backward()
        assert len(seen) == 6, seen  # the hook is on the parameter: a new reducer keeps it
        handle = tp.time_cpu_ddp_sync(restored, seen.append)
        restored(x).sum().backward()
        assert len(seen) == 8, seen  # timed twice now
        handle.remove()
        restored(x).sum().backward()
        assert len(seen) == 9, seen
        tp.untime_ddp_sync()
        plain = DDP(net())
        plain(x).sum().backward()
        assert len(seen) == 9, seen
        print("ok")
        """).replace('print("ok")', SAY_OK_AND_LEAVE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "ok" in proc.stdout, \
        _moved("torch_private", "autograd's final callbacks (Variable._execution_engine.queue_callback), "
               "register_post_accumulate_grad_hook or DDP's finalisation order") + "\n" + proc.stderr


# -- Python -----------------------------------------------------------------------------

def test_python_run_exit_handlers():
    code = ("import atexit, os\nfrom jupyter_dlc.shims.python_private import run_exit_handlers\n"
            "atexit.register(print, 'handler ran')\nrun_exit_handlers()\nos._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout == "handler ran\n", _moved("python_private", "atexit._run_exitfuncs") + proc.stderr
    assert python_private.run_exit_handlers.__module__ == "jupyter_dlc.shims.python_private"


def test_python_current_frames_sees_a_blocked_main_thread():
    """runtime/stacks.py reads the main thread's stack from the reporter thread."""
    import threading

    from jupyter_dlc.runtime import stacks

    seen = {}
    started = threading.Event()

    def reporter():
        started.wait()
        seen.update(stacks.snapshot())

    thread = threading.Thread(target=reporter)
    thread.start()
    started.set()
    thread.join()
    assert threading.main_thread().ident in python_private.current_frames(), \
        _moved("python_private", "sys._current_frames")
    assert "test_python_current_frames_sees_a_blocked_main_thread" in seen["main"], seen


# -- Jupyter ----------------------------------------------------------------------------

def test_jupyter_kernel_parent_ident():
    """A real ipykernel Kernel (not started): the private dict exists, keyed by channel."""
    from ipykernel.kernelbase import Kernel

    kernel = Kernel()
    try:
        ident = jupyter_private.shell_parent_ident(kernel)
    except (AttributeError, KeyError, TypeError) as error:
        pytest.fail(_moved("jupyter_private", "Kernel._parent_ident['shell']") + f": {error!r}")
    assert isinstance(ident, (bytes, list, type(None))), _moved("jupyter_private", "its value type")
    assert callable(getattr(kernel, "get_parent", None)), _moved("jupyter_private", "Kernel.get_parent")


# -- bokeh ------------------------------------------------------------------------------

def test_bokeh_sync_model_is_replaced():
    from jupyter_bokeh.widgets import BokehModel

    original = getattr(BokehModel, bokeh_private.SYNC_MODEL, None)
    assert callable(original), _moved("bokeh_private", "BokehModel._sync_model")
    params = list(inspect.signature(original).parameters)
    assert len(params) == 4, _moved("bokeh_private", f"_sync_model's signature {params}")

    @bokeh_private.ignore_page_events
    class Quiet(BokehModel):
        pass

    assert getattr(Quiet, bokeh_private.SYNC_MODEL) is not original
    assert getattr(BokehModel, bokeh_private.SYNC_MODEL) is original


def test_bokeh_patch_framing_is_jupyter_bokehs():
    """`send_patch` writes the comm messages jupyter_bokeh's own `_document_patched` writes
    for one change (the page's Receiver reads them), and `route_document_patches` hands the
    subclass every change the page did not make."""
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure
    from jupyter_bokeh.widgets import BokehModel

    assert callable(getattr(BokehModel, bokeh_private.DOCUMENT_PATCHED, None)), \
        _moved("bokeh_private", "BokehModel._document_patched")
    sent: dict[str, list] = {"jupyter_bokeh": [], "shim": []}

    @bokeh_private.route_document_patches
    class Routed(BokehModel):
        def document_patched(self, event):
            bokeh_private.send_patch(self, [event])

    for name, cls in (("jupyter_bokeh", BokehModel), ("shim", Routed)):
        source = ColumnDataSource({"x": [], "y": []})
        fig = figure()
        fig.line("x", "y", source=source)
        model = cls(row(fig))
        model.send = lambda content, buffers=None, into=sent[name]: into.append(
            (content, [bytes(b) for b in buffers or []]))
        source.stream({"x": [1, 2], "y": [3.0, 4.0]})

    def shape(messages):  # ids differ between documents; the framing and kinds must not
        out = []
        for content, buffers in messages:
            payload = json.loads(content["payload"]) if "payload" in content else None
            out.append((content["msg"], sorted(payload) if isinstance(payload, dict) else payload,
                        len(buffers)))
        return out

    assert sent["jupyter_bokeh"] and shape(sent["shim"]) == shape(sent["jupyter_bokeh"]), \
        _moved("bokeh_private", "jupyter_bokeh's PATCH-DOC framing")
    content = json.loads(sent["shim"][2][0]["payload"])
    assert [e["kind"] for e in content["events"]] == ["ColumnsStreamed"]


def test_torch_nccl_flight_recorder_dump():
    """The flight recorder's dump (evidence.py keeps it before a kill) is where the shim
    reads it, and answers JSON; without an NCCL group the shim gives None."""
    import json

    import torch.distributed  # noqa: F401 - the shim looks only at what is imported
    from jupyter_dlc.shims import torch_private

    dump = torch_private.flight_recorder_dump()
    assert dump is not None, "torch._C._distributed_c10d._dump_fr_trace_json moved"
    assert "version" in json.loads(dump(True, True))
    assert torch_private.nccl_flight_recorder() is None  # no NCCL group in this process
