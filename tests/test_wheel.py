"""A wheel built from a clean copy of the tree ships the prebuilt panel and the server config.

The copy holds what git tracks plus untracked files git does not ignore (the working tree as
it would be committed), so build outputs and node_modules of this checkout play no part: the
panel is built in the copy by scripts/build-labextension.sh. The wheel then goes into a fresh
venv (--system-site-packages, so torch is not reinstalled; --no-deps), and with Node.js out of
PATH, `jupyter labextension list` and `jupyter server extension list` must show it enabled/OK.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)


def _no_node_path() -> str:
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "node").exists() and not (Path(d) / "npm").exists()]
    path = os.pathsep.join(keep)
    assert shutil.which("node", path=path) is None and shutil.which("npm", path=path) is None
    return path


@pytest.mark.timeout(900)
def test_wheel_from_clean_copy_installs_enabled_extensions(tmp_path):
    if shutil.which("npm") is None:
        pytest.skip("building the panel needs npm")
    src = tmp_path / "src"
    _copy_tree(src)
    assert not (src / "jupyter_dlc" / "labextension").exists()  # nothing prebuilt sneaks in
    assert not (src / "labextension" / "node_modules").exists()
    assert (src / "labextension" / "package-lock.json").exists()

    subprocess.run([str(src / "scripts" / "build-labextension.sh")], cwd=src, check=True)
    # idempotent: a second call does not rebuild
    again = subprocess.run([str(src / "scripts" / "build-labextension.sh")], cwd=src, check=True,
                           capture_output=True, text=True)
    assert "up to date" in again.stdout

    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True)
    wheel = next(dist.glob("jupyter_dlc-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    data = [n for n in names if ".data/data/" in n]
    assert any(n.endswith("share/jupyter/labextensions/jupyter-dlc/package.json") for n in data), data
    assert any("share/jupyter/labextensions/jupyter-dlc/static/remoteEntry." in n for n in data), data
    assert any(n.endswith("etc/jupyter/jupyter_server_config.d/jupyter_dlc.json") for n in data), data
    assert "jupyter_dlc/server/handlers.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    env.update(PATH=str(venv / "bin") + os.pathsep + _no_node_path(),
               JUPYTER_CONFIG_DIR=str(tmp_path / "user-config"),  # no user-level enabling
               JUPYTER_DATA_DIR=str(tmp_path / "user-data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               DLC_DATA_DIR=str(tmp_path / "dlc-data"))
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                   env=env, check=True, capture_output=True, cwd=tmp_path)
    where = subprocess.run([str(py), "-c", "import jupyter_dlc; print(jupyter_dlc.__file__)"],
                           env=env, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout
    installed = venv / "share" / "jupyter" / "labextensions" / "jupyter-dlc" / "package.json"
    assert installed.exists()
    # --system-site-packages gives no console scripts for jupyter itself; write the ones pip
    # writes for jupyter_core / jupyterlab / jupyter_server, bound to the venv's python, so
    # that `jupyter <sub>` dispatches inside the venv (and not to a jupyter elsewhere on PATH)
    for name, target in (("jupyter", "jupyter_core.command:main"),
                         ("jupyter-labextension", "jupyterlab.labextensions:main"),
                         ("jupyter-server", "jupyter_server.serverapp:main")):
        mod, func = target.split(":")
        script = venv / "bin" / name
        script.write_text(f"#!{py}\nimport sys\nfrom {mod} import {func}\nsys.exit({func}())\n")
        script.chmod(0o755)

    lab = subprocess.run(["jupyter", "labextension", "list"], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    out = ANSI.sub("", lab.stdout + lab.stderr)
    line = [x for x in out.splitlines() if "jupyter-dlc" in x]
    assert line, out
    assert "enabled" in line[0] and "OK" in line[0] and "disabled" not in line[0], out
    # found in the venv's share/jupyter/labextensions: the listing's first section is the venv's
    sections = out.split(str(venv / "share" / "jupyter" / "labextensions"))
    assert len(sections) == 2 and "jupyter-dlc" in sections[1].split("\n\n")[0], out

    srv = subprocess.run(["jupyter", "server", "extension", "list"], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    out = ANSI.sub("", srv.stdout + srv.stderr)
    lines = out.splitlines()
    enabled = [x for x in lines if x.strip().startswith("jupyter_dlc") and "enabled" in x]
    assert enabled and "disabled" not in enabled[0], out
    assert any("jupyter_dlc" in x and x.rstrip().endswith("OK") for x in lines), out
    assert str(venv / "etc" / "jupyter") in out, out
