"""SanityCheck before every attempt: cheap checks that turn a doomed start into a clear error.

Each check takes milliseconds (no torch import: preflight sits on the launch path). A failed
check ends the job as FAILED with what failed and what to do.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

from ..hostprocs import visible_gpus
from ..spec import JobSpec


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"preflight {self.name}: {self.detail}"


@functools.lru_cache(maxsize=8)
def _torch_location(python: str) -> str | None:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        found = importlib.util.find_spec("torch")
        return os.path.dirname(found.origin) if found and found.origin else None
    probe = "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s else '')"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    origin = out.stdout.strip()
    return os.path.dirname(origin) if out.returncode == 0 and origin else None


def _torch_cuda_version(torch_dir: str) -> str | None:
    try:
        with open(os.path.join(torch_dir, "version.py")) as f:
            match = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([\d.]+)['\"]", f.read(), re.M)
    except OSError:
        return None
    return match.group(1) if match else None


def _driver_cuda_version() -> str | None:
    """The highest CUDA version the installed driver supports, from nvidia-smi's banner."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return match.group(1) if match else None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def requested_gpus(spec: JobSpec) -> int:
    """GPUs per node the spec declares (`resources.gpus`; 0 where the spec has no such field)."""
    resources = getattr(spec, "resources", None)
    gpus = resources.get("gpus", 0) if isinstance(resources, dict) else 0
    return gpus if isinstance(gpus, int) else 0


def gpu_check(requested: int, torch_dir: str | None, visible: int) -> Check | None:
    """A job that declares GPUs, on a node or a torch build without them, fails here, before
    any rank starts, instead of in every rank's first torch.cuda call. None: nothing declared."""
    if requested <= 0:
        return None
    if torch_dir is not None and _torch_cuda_version(torch_dir) is None:
        return Check("gpus", False, f"the job asks for {requested} GPU(s) per node, but the torch at "
                     f"{torch_dir} is a CPU-only build; install a CUDA build of torch in the job's "
                     "Python, or drop the GPU request and use the gloo backend")
    if visible < requested:
        seen = "no GPU" if visible == 0 else f"only {visible} GPU(s)"
        return Check("gpus", False, f"the job asks for {requested} GPU(s) per node, but this node shows "
                     f"{seen} (/dev/nvidia*, CUDA_VISIBLE_DEVICES); run it where there are GPUs or "
                     "ask for fewer")
    return Check("gpus", True, f"{visible} GPU(s) visible for {requested} requested")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_preflight(spec: JobSpec, script_path: str, checkpoint_dir: str, port: int,
                  last_checkpoint_size: int = 0, host_checks: bool = True) -> list[Check]:
    """The launcher's checks. `host_checks=False` for an engine whose nodes run their own
    (`Capabilities.node_preflight`: torch, GPUs, the shared checkpoint directory, checked
    by `runtime.node_preflight` where the ranks run): this host's torch, GPUs and ports
    say nothing about them, and only what the launcher itself needs is checked here."""
    checks: list[Check] = []
    if host_checks:
        checks += _host_checks(spec, port)
    return checks + _launcher_checks(spec, script_path, checkpoint_dir, last_checkpoint_size)


def _host_checks(spec: JobSpec, port: int) -> list[Check]:
    """What only the host that runs the ranks can tell (this one, for the local engine)."""
    checks: list[Check] = []
    python = spec.python or sys.executable
    torch_dir = _torch_location(python)
    checks.append(Check("python-torch", torch_dir is not None,
                        f"torch importable by {python}" if torch_dir else
                        f"torch is not installed for {python}; pip install torch in that environment"))
    gpus = visible_gpus()
    declared = gpu_check(requested_gpus(spec), torch_dir, gpus)
    if declared is not None:
        checks.append(declared)
    if gpus:
        checks.append(Check("devices", spec.nproc_per_node <= gpus,
                            f"{gpus} GPUs for {spec.nproc_per_node} processes per node" +
                            ("" if spec.nproc_per_node <= gpus else
                             f"; use --nproc-per-node {gpus} or fewer")))
        wanted = _torch_cuda_version(torch_dir) if torch_dir else None
        driver = _driver_cuda_version()
        if wanted and driver:
            ok = _version_tuple(driver) >= _version_tuple(wanted)
            checks.append(Check("cuda-driver", ok, f"driver supports CUDA {driver}, torch needs {wanted}"
                                + ("" if ok else "; update the NVIDIA driver or install a torch "
                                   f"built for CUDA {driver}")))
    checks.append(Check("rendezvous-port", port_free(port),
                        f"127.0.0.1:{port} is free" if port_free(port) else
                        f"127.0.0.1:{port} is taken; resubmit (a new port is chosen)"))
    return checks


def _launcher_checks(spec: JobSpec, script_path: str, checkpoint_dir: str,
                     last_checkpoint_size: int) -> list[Check]:
    """What the launcher itself needs: the checkpoint directory (it picks the resume step
    there) with room for the next checkpoints, and the job's files."""
    checks: list[Check] = []
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
        writable = os.access(checkpoint_dir, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        checks.append(Check("checkpoint-dir", False, f"{checkpoint_dir} is not writable; "
                            "choose another with --checkpoint-dir"))
    else:
        free = shutil.disk_usage(checkpoint_dir).free
        need = last_checkpoint_size * (spec.keep_last + 1)
        checks.append(Check("checkpoint-space", free >= need,
                            f"{free >> 20} MB free for {spec.keep_last + 1} checkpoints of "
                            f"{last_checkpoint_size >> 20} MB" + ("" if free >= need else
                            "; free disk space or lower --keep-last")))
    paths = [("script", script_path)] + [(f"files[{k}]", v) for k, v in spec.files.items()]
    for label, path in paths:
        ok = os.access(path, os.R_OK)
        checks.append(Check("paths", ok, f"{label} {path} " + ("is readable" if ok else
                            "cannot be read; check the path and its permissions")))
    if spec.workdir:
        ok = os.path.isdir(spec.workdir) and os.access(spec.workdir, os.R_OK | os.X_OK)
        checks.append(Check("paths", ok, f"workdir {spec.workdir} " + (
            "is usable" if ok else "is not a readable directory; fix --workdir")))
    return checks
