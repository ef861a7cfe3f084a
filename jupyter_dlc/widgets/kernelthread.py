"""Routing a background thread's kernel messages to the cell that started it (ipykernel 7).

ipykernel 7 keeps the shell parent in a ContextVar: a new thread starts with an empty
parent, so anything it sends (stream output, display updates) would belong to no cell. The
view captures the parent in the main thread while its cell runs and re-installs it in its
updater thread. Widget comm messages are routed by comm id in the front end either way;
the parent still decides which cell a headless client (nbclient) credits them to.
"""

from __future__ import annotations

from ..shims.jupyter_private import shell_parent_ident


def capture_parent():
    """(kernel, (ident, parent header)) of the cell running now, or (None, None) outside a kernel."""
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None, None
    if not Kernel.initialized():
        return None, None
    kernel = Kernel.instance()
    try:
        return kernel, (shell_parent_ident(kernel), kernel.get_parent("shell"))
    except (KeyError, TypeError, LookupError):
        return None, None


def adopt_parent(kernel, parent) -> None:
    """In the thread: make its messages belong to the captured cell."""
    if kernel is not None and parent is not None and parent[1]:
        kernel.set_parent(parent[0], parent[1], channel="shell")
