"""The Slurm engine: one batch job per attempt, one srun task per node (engine.py: the
batch script is its native request and its export form), and its warm pool of agents
holding an allocation (pool.py)."""

from .engine import SlurmEngine

__all__ = ["SlurmEngine"]
