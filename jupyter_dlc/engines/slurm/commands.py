"""Talking to Slurm: its client commands (sbatch, squeue, scancel) with the profile's
environment, sbatch's refusals in the contract's words, its job states, and the #SBATCH
lines of a spec. Shared by the Slurm engine (engine.py) and its warm pools (pool.py)."""

from __future__ import annotations

import os
import subprocess

from ... import shell
from ...spec import JobSpec
from ..contract import SubmitError

# How often one job's state is asked of slurmctld (Slurm asks clients not to hammer it);
# a rank's failure forces a fresh answer, so the engine's reason is never stale then.
POLL_INTERVAL = 1.0
# Profile options that become `#SBATCH --<option>=<value>` lines as they are.
DIRECTIVE_OPTIONS = ("partition", "account", "qos", "time", "gres", "constraint")
_TIMEOUT = 30
ACTIVE = {"PENDING": "PENDING", "CONFIGURING": "PENDING", "REQUEUED": "PENDING",
          "RESV_DEL_HOLD": "PENDING", "REQUEUE_HOLD": "PENDING", "REQUEUE_FED": "PENDING",
          "RUNNING": "RUNNING", "COMPLETING": "RUNNING", "SUSPENDED": "RUNNING",
          "STOPPED": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING",
          "RESIZING": "RUNNING"}


def profile_of(spec: JobSpec, lenient: bool = False):
    """The job's Slurm profile; with `lenient`, defaults where it names none that is here
    (an export, made where the profile may not exist)."""
    from ...clusters import ClusterError, Profile, get_profile

    default = Profile("slurm", "slurm", {})
    if not spec.cluster:
        return default
    try:
        profile = get_profile(spec.cluster)
    except ClusterError:
        if lenient:
            return default
        raise
    return profile if profile.engine == "slurm" or not lenient else default


def client_env(profile) -> dict[str, str]:
    """The environment for sbatch/squeue/scancel: the profile's (SLURM_CONF...), and none of
    the job variables of a Slurm job the launcher itself might run inside."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(profile.env)
    return env


def run_slurm(argv: list[str], env: dict[str, str], check: bool = False) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=_TIMEOUT)
    except FileNotFoundError:
        raise RuntimeError(f"{argv[0]} is not installed on the launcher's host; install the Slurm "
                           "client (Debian: slurm-client) or run the launcher on a login node") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{argv[0]} did not answer in {_TIMEOUT}s; is slurmctld up?") from None
    if check and result.returncode != 0:
        first = (result.stderr or result.stdout).strip().splitlines()
        raise RuntimeError(f"{' '.join(argv[:2])}: {first[-1] if first else 'exit ' + str(result.returncode)}")
    return result


# sbatch's words for a controller that did not answer or could not take the job right now
# (Slurm's own messages); every other refusal is about the request (an unknown partition,
# account or QOS, more nodes than there are) and would be refused again.
TRANSIENT = ("Socket timed out", "Unable to contact slurm controller", "Connection refused",
             "Connection timed out", "Zero Bytes were transmitted", "temporarily unable",
             "Resource temporarily unavailable", "Slurm backup controller in standby mode",
             "Communication connection failure", "Transport endpoint", "try again later")


def submit_error(stderr: str, code: int) -> SubmitError:
    """sbatch's refusal as the contract's SubmitError, with sbatch's own last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    message = lines[-1] if lines else f"sbatch exited with code {code}"
    transient = any(word.lower() in stderr.lower() for word in TRANSIENT)
    return SubmitError(message, permanent=not transient)


def sbatch(argv: list[str], env: dict[str, str]) -> str:
    """Run sbatch; its output, or a SubmitError saying whether a retry may help."""
    try:
        result = subprocess.run(argv, check=False, env=env, capture_output=True, text=True,
                                timeout=_TIMEOUT)
    except FileNotFoundError:
        raise SubmitError("sbatch is not installed on the launcher's host; install the Slurm "
                          "client (Debian: slurm-client) or run the launcher on a login node",
                          permanent=True) from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"sbatch did not answer in {_TIMEOUT}s; is slurmctld up?",
                          permanent=False) from None
    if result.returncode != 0:
        raise submit_error(result.stderr or result.stdout, result.returncode)
    return result.stdout


def sbatch_directives(spec: JobSpec, profile, job_name: str, output: str,
                      workdir: str | None) -> list[str]:
    """The #SBATCH lines for a spec on a profile: one task (one torchrun agent) per node.

    Every value goes through `shell.directive`: one with a newline or another control
    character is refused (`shell.UnsafeValue`, naming the field), since sbatch would run
    what follows it as shell on the node; one with spaces or quotes is quoted as sbatch reads it."""
    res = spec.resources
    lines = [shell.directive("job-name", job_name, "name"), f"--nodes={spec.nodes}",
             "--ntasks-per-node=1", f"--cpus-per-task={res.get('cpus') or spec.nproc_per_node}",
             shell.directive("output", output, "output (the launcher's data dir)")]
    if workdir:
        lines.append(shell.directive("chdir", workdir, "workdir"))
    if res.get("gpus"):
        lines.append(f"--gres=gpu:{int(res['gpus'])}")
    elif profile.get("gres"):
        lines.append(shell.directive("gres", profile.get("gres"), f"{profile.name}.gres"))
    if res.get("memory_mb"):
        lines.append(f"--mem={int(res['memory_mb'])}M")
    for key in DIRECTIVE_OPTIONS:
        if key != "gres" and profile.get(key):
            lines.append(shell.directive(key, profile.get(key), f"{profile.name}.{key}"))
    lines.extend(shell.sbatch_line(str(item), f"{profile.name}.sbatch_args[{index}]")
                 for index, item in enumerate(profile.get("sbatch_args") or []))
    return lines
