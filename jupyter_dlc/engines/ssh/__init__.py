"""The SSH engine: each node a host reached by ssh, its agent kept by a local keeper process
(engine.py; the host's end is node/ssh_node.py)."""

from .engine import SSHEngine

__all__ = ["SSHEngine"]
