"""Where each thread of this rank is, for the launcher's hang verdict.

A rank stuck in a collective or a data loader still heartbeats (its reporter thread lives),
so before the launcher ends such an attempt it asks the ranks for their stacks, through the
answer to a report; the reporter thread answers with one `stacks` event, and `why` shows
where the stuck rank was. It is what faulthandler prints on a signal, but as text that
travels over the report route, so it works on every engine.

Stdlib only: the reporter thread calls this while the main thread may hold any lock.
"""

from __future__ import annotations

import threading
import time
import traceback

from ..shims.python_private import current_frames
from ..shims.torch_private import nccl_flight_recorder

MAX_FRAMES = 40        # innermost frames kept per thread
MAX_CHARS = 3800       # per field, from the innermost end (the route takes 4,000)


def snapshot() -> dict:
    """A `stacks` report event: `main` is the main thread's stack (where training stopped),
    `threads` the other threads' (a data loader's, a checkpoint writer's), the caller's
    own thread left out."""
    me = threading.get_ident()
    main = threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    main_stack, others = "", []
    for ident, frame in current_frames().items():
        if ident == me:
            continue
        text = "".join(traceback.format_stack(frame)[-MAX_FRAMES:])
        if ident == main:
            main_stack = text
        else:
            others.append(f"Thread {names.get(ident, ident)}:\n{text}")
    out = {"type": "stacks", "t": time.time(), "main": main_stack[-MAX_CHARS:],
           "threads": "".join(others)[-MAX_CHARS:]}
    nccl = nccl_flight_recorder()  # None but where the rank runs NCCL (never imports torch)
    if nccl:
        out["nccl"] = nccl[:MAX_CHARS]
    return out
