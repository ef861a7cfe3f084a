"""Job states: the one definition the store, supervisor, API, views, CLI and panel share.

Imports nothing of ours, so every module (and the OpenAPI document the panel's types are
generated from) can take the states from here without a cycle.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    QUEUED = "QUEUED"
    PREFLIGHT = "PREFLIGHT"
    STARTING = "STARTING"
    # Submitted to a cluster engine that still queues it (the reason says why: Slurm's own).
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


# Plain strings, because they are compared with what SQLite and JSON hand back.
ACTIVE_STATES: tuple[str, ...] = tuple(s.value for s in (
    JobState.QUEUED, JobState.PREFLIGHT, JobState.STARTING, JobState.PENDING, JobState.RUNNING,
    JobState.RESTARTING, JobState.STOPPING))
TERMINAL_STATES: tuple[str, ...] = tuple(s.value for s in (
    JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED))
ALL_STATES: tuple[str, ...] = ACTIVE_STATES + TERMINAL_STATES
