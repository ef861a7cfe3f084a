"""Where the launcher keeps its state and how clients find it. Imports nothing of ours."""

from __future__ import annotations

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


def connection_file() -> str:
    return os.path.join(runtime_dir(), "jupyter-dlc-launcher.json")
