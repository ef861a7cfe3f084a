"""Preflight on a node where the ranks will run (`python -m jupyter_dlc.node.preflight`),
started by the engine once per node before the agents (Slurm: an `srun` step of its own).

Checks what only the node can tell: that torch imports in the job's Python, that the script
is there, and that the checkpoint directory is writable and is the SAME directory on every
node: node 0 writes a nonce (DLC_PREFLIGHT_NONCE) into it, every node must read it back. A
node-local disk under the same path passes a writability check and loses checkpoints the
first time a rank on another node restores. The result goes to the launcher over the report
route (`node_preflight` event, layout.py); the exit code tells the batch script whether to
start the agents. Stdlib only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time

from .. import layout

WAIT_SECONDS = 20.0  # how long a node waits for node 0's nonce (NFS attribute caching)
REPORT_SECONDS = 15.0  # how long the verdict is retried while the launcher does not answer


def check(node: int, host: str, env: dict[str, str]) -> str | None:
    """None when this node is fit to run its ranks, else what is wrong and how to fix it."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed for {sys.executable} on {host}; install it there"
    script = os.path.join(env.get("DLC_JOB_DIR", ""), "script.py")
    if env.get("DLC_JOB_DIR") and not os.access(script, os.R_OK):
        return (f"{host} cannot read the job's script {script}; mount the launcher's data "
                "directory on every node")
    checkpoint_dir, nonce = env.get("DLC_CHECKPOINT_DIR", ""), env.get("DLC_PREFLIGHT_NONCE", "")
    if not checkpoint_dir or not nonce:
        return None
    path = layout.preflight_marker(checkpoint_dir, env.get("DLC_JOB_ID", "job"), env.get("DLC_ATTEMPT", "0"))
    if node == 0:
        try:
            os.makedirs(checkpoint_dir, exist_ok=True)
            layout.write_json_atomic(path, {"nonce": nonce, "host": host})
        except OSError as error:
            return (f"checkpoint directory {checkpoint_dir} is not writable on {host} "
                    f"({error.strerror}); choose another with --checkpoint-dir")
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        seen = _read(path)
        if seen and seen.get("nonce") == nonce:
            break
        if time.monotonic() > deadline:
            return (f"{host} does not see the checkpoint directory {checkpoint_dir} that node 0 "
                    f"wrote to (its marker {os.path.basename(path)} is missing here): mount the same "
                    "shared filesystem at that path on every node, or choose a shared "
                    "--checkpoint-dir")
        time.sleep(0.2)
    try:  # this node saw it; node 0 removes the marker once every node acknowledged
        with open(f"{path}.ok-{node}", "w"):
            pass
    except OSError as error:
        return f"checkpoint directory {checkpoint_dir} is not writable on {host} ({error.strerror})"
    if node == 0:
        markers = [f"{path}.ok-{n}" for n in range(int(env.get("DLC_NNODES", "1")))]
        while not all(os.path.exists(m) for m in markers) and time.monotonic() < deadline + WAIT_SECONDS:
            time.sleep(0.2)
        for leftover in [path, *markers]:
            try:
                os.remove(leftover)
            except OSError:
                pass
    return None


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main() -> int:
    env = dict(os.environ)
    node = int(env.get("DLC_NODE_RANK", env.get("SLURM_NODEID", "0")))
    # The name the engine knows the node by (an SSH profile's host), else Slurm's, else its own.
    host = env.get("DLC_NODE_HOST") or env.get("SLURMD_NODENAME") or socket.gethostname()
    problem = check(node, host, env)
    from ..runtime.report import send_events_now

    delivered = send_events_now([{"type": layout.NODE_PREFLIGHT, "node": node, "host": host,
                                  "ok": problem is None,
                                  "message": (f"node {node} ({host}): {problem}" if problem else
                                              f"node {node} ({host}): ready")[:layout.RECORD_TEXT]}],
                                REPORT_SECONDS)
    if problem:
        print(f"jupyter-dlc preflight, node {node} ({host}): {problem}", file=sys.stderr, flush=True)
    if not delivered:
        # Ranks started here could not report either (no heartbeat, no step): a restart
        # would meet the same wall. The exit code says it, since no event will.
        print(f"jupyter-dlc preflight, node {node} ({host}): cannot reach the launcher at "
              f"{env.get('DLC_LAUNCHER_URL')}", file=sys.stderr, flush=True)
        return layout.PREFLIGHT_UNREACHABLE
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
