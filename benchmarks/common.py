"""What the job benchmarks share: a private launcher in a temp dir, and a free port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_launcher(prefix: str, script_name: str, script_text: str):
    """(client, root, script path): a launcher of its own, so no user's jobs are touched."""
    root = tempfile.mkdtemp(prefix=prefix)
    os.environ["DLC_DATA_DIR"] = os.path.join(root, "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(root, "runtime")
    from jupyter_dlc.client import LauncherClient

    script = os.path.join(root, script_name)
    with open(script, "w") as f:
        f.write(script_text)
    return LauncherClient.connect(), root, script


def stop_launcher(client, root: str | None = None) -> None:
    """SIGTERM the private launcher; with `root`, wait for it and remove its temp dir (an
    ingest run leaves hundreds of MB of metrics there)."""
    pid = client.request("GET", "/healthz")[1]["pid"]
    os.kill(pid, signal.SIGTERM)
    if root is None:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)
