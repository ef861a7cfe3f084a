"""The local engine: a job's nodes as torchrun agents on this machine (engine.py), its warm
pool's driver (pool.py)."""

from .engine import LocalEngine

__all__ = ["LocalEngine"]
