"""Where the launcher keeps its state and how clients find it. Imports nothing of ours."""

from __future__ import annotations

import hashlib
import os


def data_dir() -> str:
    """Jobs, logs, checkpoints and the SQLite store: `$DLC_DATA_DIR` or ~/.local/share/jupyter-dlc."""
    path = os.environ.get("DLC_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter-dlc")
    return os.path.abspath(path)


def runtime_dir() -> str:
    """Jupyter's runtime directory (honours JUPYTER_RUNTIME_DIR), where connection files live."""
    if os.environ.get("JUPYTER_RUNTIME_DIR"):
        return os.environ["JUPYTER_RUNTIME_DIR"]
    from jupyter_core.paths import jupyter_runtime_dir

    return jupyter_runtime_dir()


def connection_file(data: str | None = None, runtime: str | None = None) -> str:
    """The connection file of the launcher that serves `data` (default: `data_dir()`).

    Keyed by the data directory: two data directories in one runtime directory get two
    launchers, never one launcher that puts jobs in the wrong place.
    """
    key = hashlib.sha256(os.path.abspath(data or data_dir()).encode()).hexdigest()[:12]
    return os.path.join(runtime or runtime_dir(), f"jupyter-dlc-launcher-{key}.json")


# In the data dir: held (flock) by the launcher that serves it, with its pid and connection
# file in it, so that a client can name a launcher that holds the data dir but does not answer.
LOCK_FILE = "launcher.lock"


# What tells a process where the launcher's connection file or data are. Ranks do not
# inherit these: the job token (DLC_TOKEN) must stay the only credential a rank holds.
LOCATING_PREFIXES = ("DLC_", "EASYCKPT_", "JUPYTER_", "JPY_")


def private_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` without what locates the launcher (for a job's processes)."""
    return {k: v for k, v in environ.items() if not k.startswith(LOCATING_PREFIXES)}
