"""Jupyter's (ipykernel's) private APIs.

`Kernel._parent_ident["shell"]`: the routing identity of the shell request being handled.
A thread that outputs for a cell after the cell returned (the live job view) must send its
messages with the cell's parent header and identity, so the front end shows them under that
cell; `get_parent("shell")` gives the header, only this private dict gives the identity.
"""

from __future__ import annotations

from typing import Any


def shell_parent_ident(kernel: Any) -> Any:
    """The identity of the shell request `kernel` is handling (KeyError/TypeError if none)."""
    return kernel._parent_ident["shell"]
