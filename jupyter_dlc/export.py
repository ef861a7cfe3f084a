"""Export a job as a self-contained bundle that runs with plain torchrun.

```
<dest>/
  script.py      what the ranks run (captured code + the cell, or the job's script)
  job.yaml       the job spec; `script` and `files` relative to this directory
  files/         pushed values; DLC_JOB_DIR is set to <dest> so the script finds them
  run.sh         ./run.sh all (every node on this machine) or ./run.sh K (node K)
  job.sbatch     sbatch job.sbatch (from this directory) on a Slurm cluster, whichever engine
                 ran the job: one torchrun agent per node via srun
  k8s/           kubectl apply -f k8s/ on a Kubernetes cluster, whichever engine ran the job
                 (an Indexed Job, or the profile's TrainJob/PyTorchJob; edit image, namespace)
  <extra>        each engine's own form (k8s/*.yaml manifests, job.sbatch)
```

Neither Jupyter nor the launcher is needed: run.sh is torchrun with a static rendezvous on
the job's topology, and the environment the launcher would have given (README, "The
environment every rank gets": DLC_JOB_ID, DLC_JOB_DIR, DLC_CHECKPOINT_DIR..., the spec's env,
the network profile). Only what talks to the launcher (DLC_LAUNCHER_URL, DLC_TOKEN) is left
out. Every value is quoted through `shell`: nothing the spec holds runs as shell.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

import yaml

from . import shell
from .spec import JobSpec, network_env, params_env, parse_branch

BUNDLE_OWN = ("script.py", "job.yaml", "run.sh", "files", "checkpoints")
RESERVED = (*BUNDLE_OWN, "job.sbatch")  # and the engines' own forms, for `extra`
DEFAULT_PORT = 29500


class ExportError(ValueError):
    """One line naming what is wrong with the export request."""


def _load_spec(spec: JobSpec | dict[str, Any]) -> tuple[JobSpec, dict[str, str]]:
    data = dict(spec.to_dict() if isinstance(spec, JobSpec) else spec)
    # A stored job's staged files may be gone (they were copied into its job directory);
    # they are checked as they are copied, not by the spec.
    staged = dict(data.pop("files", None) or {})
    return JobSpec.from_dict(data), staged


def _check_bundle_name(name: str, who: str, reserved: tuple[str, ...] = RESERVED) -> None:
    """`name` (an extra file, an engine's export file) stays inside the bundle and off the
    bundle's own files."""
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts or not name or parts[0] in reserved:
        raise ExportError(f"{who}: {name!r} must be a relative path inside the bundle, other "
                          f"than {', '.join(reserved)}")


EXPORTED_MARK = "DLC_EXPORTED"


@dataclass(frozen=True)
class Branch:
    """A branch's step as a bundle restores it: PARENT@STEP, and the step's directory."""
    ref: str
    path: str


def branch_step(client, spec: JobSpec, job_id: str | None = None) -> Branch | None:
    """Where a bundle of `spec` finds its branch step: the branch's own copy (the job
    `job_id`, which the launcher planted) while it keeps it, else the parent's; None for a
    job that is no branch. ExportError when neither holds it any more."""
    if spec.branch_from is None:
        return None
    from .client import LauncherError

    ref, step = parse_branch(spec.branch_from)
    for owner in ([job_id] if job_id else []) + [ref]:
        try:
            usable = [c for c in client.checkpoints(owner) if c.get("verification") != "corrupt"]
        except LauncherError:
            continue
        picked = [c for c in usable if c["step"] == step] if step is not None else usable[-1:]
        if picked and owner == ref:
            return Branch(f"{client.job(ref)['id']}@{picked[0]['step']}", picked[0]["path"])
        if picked:
            return Branch(spec.branch_from, picked[0]["path"])
    raise ExportError(f"branch_from: step {step if step is not None else '(newest)'} of {ref} is kept "
                      "neither by the branch nor by its parent, so no bundle can restore it")


def bundle_env(spec: JobSpec, job_id: str | None = None, branch: Branch | None = None) -> list[str]:
    """The environment every rank gets (README, "The environment every rank gets"), as the
    `export` lines of run.sh and job.sbatch, less what talks to the launcher (its URL and
    the token): "$HERE" is the bundle. Each is a default: a value already set (even empty)
    in the caller's environment wins. A branch's bundle restores its step from where this
    machine keeps it (`branch`), running the bundle's code as the branch did."""
    lines = [
        # DLC_JOB_DIR is this bundle, so pushed values load from files/.
        'export DLC_JOB_DIR="$HERE"',
        shell.export_default("DLC_JOB_ID", job_id or spec.name),
        shell.export_default("DLC_JOB_NAME", spec.name),
        shell.export("DLC_NNODES", str(spec.nodes)),
        shell.export("DLC_NPROC_PER_NODE", str(spec.nproc_per_node)),
        shell.export_default("DLC_ATTEMPT", "1"),
        shell.export_default("DLC_CHECKPOINT_DIR", shell_word='"$HERE/checkpoints"', empty_wins=False),
        shell.export_default("DLC_RESUME_PATH", branch.path if branch else ""),
        shell.export_default("EASYCKPT_RESUME_PATH", shell_word='"$DLC_RESUME_PATH"'),
        # No launcher to remove node-held checkpoint copies again: the ranks keep none.
        shell.export("DLC_NODE_COPY", "0"),
        # The bundle carries the job's id, so a launcher on the same machine would take its
        # processes for leftovers of that (ended) job and kill them: this marks them as not
        # the launcher's (engines/local/engine.py job_processes).
        shell.export(EXPORTED_MARK, "1"),
    ]
    # As the launcher gives them: empty for a job that is no branch.
    lines += [shell.export_default("DLC_BRANCH_FROM", branch.ref if branch else ""),
              shell.export_default("DLC_FRESH_OPTIMIZER", "1" if branch and spec.fresh_optimizer else "")]
    env = dict(network_env(spec.network))
    env.update(params_env(spec.params))  # a sweep trial's values, as the launcher gives them
    env.update(spec.env)  # the user's --env wins, as in the launcher
    env.setdefault("PYTHONUNBUFFERED", "1")
    return lines + [shell.export_default(key, value) for key, value in env.items()]


def render_run_sh(spec: JobSpec, uses_runtime: bool = False, job_id: str | None = None,
                  branch: Branch | None = None) -> str:
    nodes, nproc = spec.nodes, spec.nproc_per_node
    torchrun = [spec.python, "-m", "torch.distributed.run"] if spec.python else ["torchrun"]
    node_lines = "\n".join(
        f"#     MASTER_ADDR=<host of node 0> ./run.sh {k}" for k in range(min(nodes, 4)))
    if nodes > 4:
        node_lines += f"\n#     ... up to ./run.sh {nodes - 1}"
    needs = "torch" + (" and jupyter-dlc (the script imports jupyter_dlc)" if uses_runtime else "")
    env = "\n".join(bundle_env(spec, job_id, branch))
    return f"""#!/usr/bin/env bash
# Job {spec.name!r} exported by jupyter-dlc: {nodes} node(s) x {nproc} process(es) per node,
# started with plain torchrun (static rendezvous). Needs {needs}.
#
#   ./run.sh all        every node on this machine, in the background (a one-machine try)
#   ./run.sh K          node K (0..{nodes - 1}); run one per host, all with node 0's address:
{node_lines}
#   NODE_RANK=K ./run.sh   same as ./run.sh K
#
# MASTER_ADDR defaults to 127.0.0.1, MASTER_PORT to {DEFAULT_PORT} (a free port for "all").
# Every variable below is a default: a value already set in your environment wins.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NNODES={nodes}
NPROC_PER_NODE={nproc}
# TORCHRUN="..." ./run.sh runs another torchrun command (split on spaces).
if [ -n "${{TORCHRUN:-}}" ]; then
    read -r -a TORCHRUN <<< "$TORCHRUN"
else
    TORCHRUN=({shell.command(torchrun)})
fi
ARGS=({shell.command(spec.args)})

# The launcher's environment, less its URL and the job's token.
{env}
export MASTER_ADDR="${{MASTER_ADDR:-127.0.0.1}}"
{shell.export_default("DLC_WORKDIR", spec.workdir or "", empty_wins=False, exported=False)}
[ -n "$DLC_WORKDIR" ] && [ -d "$DLC_WORKDIR" ] || DLC_WORKDIR="$HERE"
cd "$DLC_WORKDIR"
mkdir -p "$DLC_CHECKPOINT_DIR"

run_node() {{
    DLC_NODE_RANK="$1" "${{TORCHRUN[@]}}" --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \\
        --node-rank "$1" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\
        "$HERE/script.py" ${{ARGS[@]+"${{ARGS[@]}}"}}
}}

MODE="${{1:-${{NODE_RANK:-}}}}"
if [ "$MODE" = all ]; then
    if [ -z "${{MASTER_PORT:-}}" ]; then
        MASTER_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))"
    fi
    export MASTER_PORT
    # Each node in its own process group, so a failed run is ended whole (agents and ranks):
    # a gloo agent whose peer died can otherwise wait minutes in its exit barrier.
    set -m
    pids=()
    for ((k = 0; k < NNODES; k++)); do
        run_node "$k" &
        pids+=("$!")
    done
    stop_all() {{
        for pid in "${{pids[@]}}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
        for _ in $(seq 50); do
            alive=0
            for pid in "${{pids[@]}}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            [ "$alive" = 0 ] && return 0
            sleep 0.2
        done
        for pid in "${{pids[@]}}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    }}
    trap 'stop_all; exit 130' INT TERM
    rc=0
    for ((k = 0; k < NNODES; k++)); do
        wait -n || {{ rc=$?; echo "run.sh: a node failed (exit $rc); stopping the others" >&2
                      stop_all; break; }}
    done
    wait || true
    exit "$rc"
fi
case "$MODE" in
    ''|*[!0-9]*)
        echo "usage: ./run.sh all | ./run.sh K (K = 0..$((NNODES - 1))) | NODE_RANK=K ./run.sh" >&2
        exit 2 ;;
esac
if [ "$MODE" -ge "$NNODES" ]; then
    echo "run.sh: node $MODE does not exist; this job has $NNODES node(s): 0..$((NNODES - 1))" >&2
    exit 2
fi
export MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"
DLC_NODE_RANK="$MODE" exec "${{TORCHRUN[@]}}" --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \\
    --node-rank "$MODE" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\
    "$HERE/script.py" ${{ARGS[@]+"${{ARGS[@]}}"}}
"""


def export_bundle(spec: JobSpec | dict[str, Any], script_text: str, dest_dir: str,
                  files: dict[str, str] | None = None, extra: dict[str, str] | None = None,
                  overwrite: bool = False, job_id: str | None = None,
                  branch: Branch | None = None) -> list[str]:
    """Write the bundle into `dest_dir` and return the paths written.

    `job_id` is the bundle's DLC_JOB_ID (the job's, when it ran; else the job's name).
    `branch`: where a branch's step is (branch_step); the bundle restores it.

    `files` (name -> path) are the pushed values to copy into files/; when None, the spec's
    own `files` are used. `extra` (relative name -> text) are more files to write.
    Refuses a non-empty `dest_dir` unless `overwrite`.
    """
    job, staged = _load_spec(spec)
    files = staged if files is None else dict(files)
    for name, path in files.items():
        if "/" in name or name.startswith(".") or not name:
            raise ExportError(f"files: {name!r} is not a plain file name")
        if not os.path.isfile(path):
            raise ExportError(f"files: {name!r} → {path!r} does not exist; export from the job "
                              "directory, where the launcher copied it")
    for name in extra or {}:
        _check_bundle_name(name, "extra")
    dest = os.path.abspath(dest_dir)
    if os.path.isdir(dest) and os.listdir(dest) and not overwrite:
        raise ExportError(f"{dest_dir}: the directory is not empty; choose a new one")
    os.makedirs(os.path.join(dest, "files"), exist_ok=True)

    written = []

    def write(rel: str, text: str, mode: int = 0o644) -> None:
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        written.append(path)

    write("script.py", script_text if script_text.endswith("\n") else script_text + "\n")
    for name, path in files.items():
        target = os.path.join(dest, "files", name)
        shutil.copyfile(path, target)
        written.append(target)

    record = job.to_dict()
    record.update(script="script.py", code=None, files={n: f"files/{n}" for n in files})
    header = ("# jupyter-dlc job spec, exported with its bundle. Paths are relative to this\n"
              "# directory; script.py is what the ranks ran (captured code + the cell).\n")
    write("job.yaml", header + yaml.safe_dump(record, sort_keys=False))
    write("run.sh", render_run_sh(job, uses_runtime="jupyter_dlc" in script_text, job_id=job_id,
                                  branch=branch), 0o755)
    # Every engine's own form (job.sbatch, k8s/*.yaml), through the engine contract.
    from . import engine_registry
    from .engines.contract import get_engine

    exports = bundle_env(job, job_id, branch)
    for name in engine_registry.names():
        for rel, text in get_engine(name).export_files(job, script_text, files, job_id or job.name,
                                                       exports).items():
            _check_bundle_name(rel, f"engine {name}: its export file", BUNDLE_OWN)
            write(rel, text, 0o755 if rel.endswith((".sbatch", ".sh")) else 0o644)
    for name, text in (extra or {}).items():
        write(name, text)
    return written


def export_job(client, job_id: str, dest_dir: str) -> list[str]:
    """A bundle for a job the launcher knows: its recorded script, spec and pushed files.

    The pushed files are read from the job's directory, which the launcher names: they are
    binary inputs of the job, not a view of its state.
    """
    job = client.job(job_id)
    recorded = client.script(job["id"])
    files = {name: os.path.join(job["job_dir"], "files", name) for name in recorded["files"]}
    branch = branch_step(client, JobSpec.from_dict(dict(job["spec"], files={})), job["id"])
    return export_bundle(job["spec"], recorded["script"], dest_dir, files=files, job_id=job["id"],
                         branch=branch)
