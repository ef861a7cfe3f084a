"""A real JupyterLab with the jupyter_dlc server extension and the built labextension.

The one harness behind the browser tests (tests/test_panel_browser.py,
tests/test_view_browser.py) and benchmarks/live_view.py: headless Chromium's path and flags,
`free_port()`, `wait_until()`, and `running_lab()`, which builds the labextension
(scripts/build-labextension.sh, idempotent), starts Lab on a free port in a fresh temp dir and
stops it, and the launcher it started, on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, interval=0.25):
    """pred()'s first truthy value within `timeout` s, else AssertionError with the last value."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def running_lab(prefix: str, base_url: str, token: str, *, timeout: float = 90,
                quiet_build: bool = False) -> Iterator[dict]:
    """JupyterLab at 127.0.0.1:<free port><base_url>, authenticated by `token`.

    Yields {"url", "env", "tmp", "root"}: the Lab's URL (ends with base_url), the environment
    it runs in (its own JUPYTER_RUNTIME_DIR, JUPYTER_CONFIG_DIR, JUPYTERLAB_WORKSPACES_DIR and
    DLC_DATA_DIR under tmp; use it for `jupyter_dlc.cli` and the launcher), the temp dir
    (mkdtemp(prefix=prefix); Lab's output goes to tmp/lab.log) and Lab's root_dir (tmp/root).
    The built labextension is found the way an installed one is: a labextensions dir,
    tmp/labext/jupyter-dlc, linking to jupyter_dlc/labextension. On exit Lab is terminated
    (killed after 15 s) and `jupyter_dlc.cli launcher stop` stops the launcher it started.
    """
    subprocess.run([str(REPO / "scripts" / "build-labextension.sh")], check=True,
                   stdout=subprocess.DEVNULL if quiet_build else None)
    built = REPO / "jupyter_dlc" / "labextension"
    assert (built / "package.json").exists()

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    for d in ("runtime", "config", "workspaces", "root", "data", "labext"):
        (tmp / d).mkdir()
    (tmp / "labext" / "jupyter-dlc").symlink_to(built)
    env = dict(os.environ)
    env.update(JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), DLC_DATA_DIR=str(tmp / "data"),
               PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1")
    base_share = os.path.join(sys.base_prefix, "share", "jupyter")
    if sys.base_prefix != sys.prefix and os.path.isdir(base_share):
        # A venv made with --system-site-packages: its packages come from the base install, and
        # so must their labextensions (ipywidgets' manager), or widgets show as plain text.
        # Ours in tmp/labext still comes first (extra_labextensions_path wins over JUPYTER_PATH).
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [env.get("JUPYTER_PATH"), base_share]))
    port = free_port()
    url = f"http://127.0.0.1:{port}{base_url}"
    with open(tmp / "lab.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", f"--port={port}",
             "--ip=127.0.0.1", f"--ServerApp.token={token}", f"--ServerApp.base_url={base_url}",
             f"--ServerApp.root_dir={tmp / 'root'}",
             "--ServerApp.jpserver_extensions={'jupyter_dlc': True}",
             f"--LabApp.extra_labextensions_path={tmp / 'labext'}"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            def up():
                try:
                    req = urllib.request.Request(url + "api/status",
                                                 headers={"Authorization": f"token {token}"})
                    return urllib.request.urlopen(req, timeout=2).status == 200
                except OSError:
                    assert proc.poll() is None, (tmp / "lab.log").read_text()
                    return False

            wait_until(up, timeout, "jupyter lab")
            yield {"url": url, "env": env, "tmp": tmp, "root": tmp / "root"}
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            # Jobs outlive their launcher by design: a test that failed mid-job leaves its job
            # running, and its ranks load whatever runs next. Stop them first.
            subprocess.run([sys.executable, "-c", STOP_ACTIVE_JOBS], env=env,
                           capture_output=True, timeout=60, check=False)
            subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "launcher", "stop"], env=env,
                           capture_output=True, timeout=30, check=False)


STOP_ACTIVE_JOBS = """
from jupyter_dlc.client import LauncherClient
from jupyter_dlc.states import ACTIVE_STATES
client = LauncherClient.from_connection_file()
if client is not None:
    active = [job["id"] for job in client.jobs() if job["state"] in ACTIVE_STATES]
    for job_id in active:
        client.stop(job_id, grace=2)
    for job_id in active:  # STOPPED: its processes, and its next attempt's standbys, are gone
        client.wait(job_id, timeout=30)
"""


def run_cell(page, index: int) -> None:
    """Select code cell `index` and run it (Shift+Enter); again if its prompt did not change."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    for _ in range(3):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function("(el) => /\\[(\\*|\\d+)\\]/.test(el.textContent)",
                                   arg=prompt.element_handle(), timeout=10000)
            return
        except Exception:
            continue
    raise AssertionError(f"code cell {index} did not start running")
