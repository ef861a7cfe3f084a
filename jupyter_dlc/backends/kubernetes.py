"""Kubernetes engine: one TrainJob, PyTorchJob or Indexed Job (+ headless Service) per attempt.

The manifests come from `k8s_manifests.build` (pure dicts); this module adds what needs the
cluster profile and the attempt's files. The ranks do not share the launcher's filesystem:
the script and pushed values travel in a ConfigMap (or on the profile's PVC), checkpoints go
to the PVC, and the ranks report to the launcher by URL (`launcher_url` in the profile).
"""

from __future__ import annotations

import os
from typing import Any

from .. import k8s_manifests
from ..spec import JobSpec
from . import AttemptContext, Backend, Capabilities


def profile_of(spec: JobSpec, lenient: bool = False):
    from ..clusters import engine_profile

    return engine_profile(spec.cluster, "kubernetes", lenient)


def read_job_files(job_dir: str) -> dict[str, bytes]:
    folder = os.path.join(job_dir, "files")
    if not os.path.isdir(folder):
        return {}
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def attempt_env(ctx: AttemptContext, profile) -> dict[str, str]:
    """The env contract as the pods get it: the launcher's DLC_* and EASYCKPT_* for this
    attempt, the launcher's URL as pods reach it; never the token (a Secret carries it)."""
    env = {k: v for k, v in ctx.env.items()
           if k.startswith(("DLC_", "EASYCKPT_")) and k != "DLC_TOKEN"}
    if profile.get("launcher_url"):
        env["DLC_LAUNCHER_URL"] = profile.get("launcher_url")
    resume = env.get("EASYCKPT_RESUME_PATH")
    if resume and ctx.spec.checkpoint_dir and resume.startswith(ctx.spec.checkpoint_dir):
        # The same step, in the job's checkpoint directory on the PVC as the pods see it.
        env["EASYCKPT_RESUME_PATH"] = (k8s_manifests.checkpoint_dir(ctx.job_id)
                                       + resume[len(ctx.spec.checkpoint_dir):])
    return env


class KubernetesBackend(Backend):
    name = "kubernetes"

    def capabilities(self, spec: JobSpec) -> Capabilities:
        return Capabilities(standby_agents=False, shared_filesystem=False, per_rank_signals=False)

    def token_secret(self, ctx: AttemptContext) -> str:
        return k8s_manifests.resource_name(ctx.job_id, ctx.attempt) + "-token"

    def dry_run(self, ctx: AttemptContext, kind: str | None = None) -> dict[str, Any]:
        profile = profile_of(ctx.spec)
        with open(ctx.script_path) as f:
            script = f.read()
        manifests = k8s_manifests.build(
            ctx.spec, ctx.job_id, ctx.attempt, attempt_env(ctx, profile), script,
            read_job_files(ctx.job_dir), profile.options, kind=kind,
            token_secret=self.token_secret(ctx))
        return {"backend": "kubernetes", "cluster": profile.name, "manifests": manifests}


def export_manifests(spec: JobSpec, script: str, files: dict[str, str]) -> dict[str, str]:
    """`k8s/*.yaml` of an exported bundle, whichever engine ran the job: `kubectl apply -f k8s/`
    runs it with plain torchrun (no launcher: no token, no launcher URL). Options come from
    the job's Kubernetes profile when it has one here; else the defaults name what to edit."""
    import yaml

    from ..spec import network_env

    profile = profile_of(spec, lenient=True)
    options = dict(profile.options)
    env = {"DLC_JOB_NAME": spec.name, "DLC_NNODES": str(spec.nodes),
           "DLC_NPROC_PER_NODE": str(spec.nproc_per_node), "DLC_ATTEMPT": "1",
           **network_env(spec.network, profile.get("interface"))}
    pushed = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            pushed[name] = f.read()
    job_id = spec.name or "job"
    name = k8s_manifests.resource_name(job_id, 1)
    notes = [f"# jupyter-dlc export of job {spec.name!r}: kubectl apply -f k8s/ (in file order)."]
    if not profile.options:
        notes.append(f"# Defaults to edit: namespace {k8s_manifests.DEFAULT_NAMESPACE!r}, image "
                     f"{k8s_manifests.DEFAULT_IMAGE!r} (needs torch), PVC 'dlc-checkpoints'.")
    try:
        manifests = k8s_manifests.build(spec, job_id, 1, env, script, pushed, options, bootstrap=False)
    except k8s_manifests.ManifestError:
        options["files"] = "pvc"  # too big for a ConfigMap: the files go on the PVC
        manifests = k8s_manifests.build(spec, job_id, 1, env, script, pushed, options, bootstrap=False)
        notes.append(f"# script.py and files/ are too big for a ConfigMap: copy them to the PVC "
                     f"at jobs/{name}/ before applying.")
    namespace = options.get("namespace") or k8s_manifests.DEFAULT_NAMESPACE
    manifests.insert(0, k8s_manifests.pvc(options.get("pvc") or "dlc-checkpoints", namespace))
    header = "\n".join(notes) + "\n"
    return {f"k8s/{i:02d}-{m['kind'].lower()}.yaml": header + yaml.safe_dump(m, sort_keys=False)
            for i, m in enumerate(manifests)}
