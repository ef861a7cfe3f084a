"""The engine table of the conformance suite: each engine configuration the scenarios run on,
and the cluster it needs, brought up once per module.

Every cluster runs on this machine, for real where one can: the local engine; Slurm
(`scripts/local-slurm.sh`: slurmctld and 4 slurmd, real sbatch/squeue/scancel; with a shared
filesystem and without one, where the nodes' Python runs in a mount namespace that hides the
launcher's data directory, as on the SSH hosts); SSH hosts
(`scripts/ssh-hosts.sh`: two network namespaces with an sshd each, with a shared filesystem
and without one, where the hosts' Python runs in a mount namespace that hides the launcher's
data directory); Kubernetes against the API stand-in (tests/k8s_standin.py), a stand-in
because no API server can run here, whose `Kubelet` runs each pod's container as a local
process (real torchrun ranks reporting to the launcher, checkpoints on a directory standing
for the PVC, which the launcher mounts as `launcher_pvc_dir`).

Adding a configuration is one `EngineConfig` in `CONFIGS`: a cluster kind (`KINDS`: how to
bring it up and its base profile), the profile options over the base, and whether it pools.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import LauncherEnv, wait_for

from jupyter_dlc import clusters
from jupyter_dlc.engines.contract import Capabilities, get_engine
from jupyter_dlc.spec import JobSpec


@dataclass
class Cluster:
    """A cluster that is up: the base profile its configurations start from, and how the
    engine refuses a submit there (profile options whose submit the engine itself refuses,
    and words of that refusal the job's reason must carry)."""

    kind: str
    base: str | None  # the base profile's name (None: the local engine, no profile)
    refused: dict[str, Any] | None  # profile options the engine refuses at submit
    refused_words: str = ""
    env: dict[str, str] = field(default_factory=dict)
    on_launcher: Callable[[LauncherEnv, dict], dict] | None = None  # per-launcher profile options
    objects: dict[str, Any] = field(default_factory=dict)  # the kind's own handles (the stand-in)
    # A stop's grace is handed to the engine, which kills when it is over (Kubernetes: the
    # kubelet's termination grace period), not the launcher's `grace over` kill.
    grace_by_engine: bool = False


@dataclass(frozen=True)
class EngineConfig:
    id: str
    kind: str  # a key of KINDS
    options: tuple[tuple[str, Any], ...] = ()  # over the base profile; a profile of its own if any
    pool: bool = False  # a warm pool of the scenarios' 2x2 shape is up: their ranks start warm

    @property
    def engine(self) -> str:
        return {"local": "local", "slurm": "slurm", "ssh": "ssh", "k8s": "kubernetes"}[self.kind]


CONFIGS = (
    EngineConfig("local-cold", "local"),
    EngineConfig("local-warm", "local", pool=True),
    EngineConfig("slurm-cold", "slurm"),
    EngineConfig("slurm-warm", "slurm", pool=True),
    EngineConfig("slurm-noshare", "slurm", (("shared_filesystem", False),)),
    EngineConfig("ssh-shared", "ssh"),
    EngineConfig("ssh-noshare", "ssh", (("shared_filesystem", False),)),
    EngineConfig("k8s-standin", "k8s"),
)


# -- the cluster kinds ----------------------------------------------------------------------

@contextlib.contextmanager
def _local(root: Path) -> Iterator[Cluster]:
    yield Cluster("local", None, None)


@contextlib.contextmanager
def _slurm(root: Path) -> Iterator[Cluster]:
    from test_slurm import local_slurm

    with local_slurm(root, "18117") as env:
        # The launcher's own checks (sinfo on the profile's partition) pass; sbatch refuses.
        yield Cluster("slurm", "local-slurm", {"sbatch_args": ["--partition=nosuch"]},
                      "sbatch refused: sbatch: error: Batch job submission failed: "
                      "Invalid partition name specified", env,
                      lambda launcher, options: _unshared(launcher, root, options))


def _unshared(launcher: LauncherEnv, root: Path, options: dict) -> dict:
    """Profile options of a configuration without a shared filesystem: nodes whose Python
    cannot see the launcher's data directory, and a checkpoint directory all of them see."""
    if options.get("shared_filesystem", True):
        return {}
    return {"python": str(_hidden_job_dirs(launcher, root)),
            "checkpoint_dir": str(Path(launcher.root) / "ckpt")}


def _hidden_job_dirs(launcher: LauncherEnv, root: Path) -> Path:
    """A `python` for the hosts that cannot see the launcher's data directory: it runs in a
    mount namespace of its own with an empty tmpfs there (no shared filesystem)."""
    wrapper = root / f"python-without-{os.path.basename(launcher.root)}"
    wrapper.write_text(f"""#!/bin/sh
exec unshare -m --propagation private sh -c 'mount -t tmpfs dlchidden "$0" && exec "$@"' \\
    {launcher.data_dir} {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


@contextlib.contextmanager
def _ssh(root: Path) -> Iterator[Cluster]:
    from test_ssh import ssh_hosts

    with ssh_hosts(root, "dlcc", "10.233.0") as env:
        # Nothing listens on port 9 of a host: ssh's own "Connection refused".
        yield Cluster("ssh", "local-ssh", {"port": 9}, "ssh: connect to host 10.233.0.1 port 9: Connection refused",
                      env, lambda launcher, options: _unshared(launcher, root, options))


@contextlib.contextmanager
def _k8s(root: Path) -> Iterator[Cluster]:
    from k8s_standin import Kubelet, Standin

    pvc = root / "pvc"
    with Standin(groups=("trainer.kubeflow.org", "kubeflow.org"),
                 kubelet=Kubelet(str(root / "kubelet"), str(pvc))) as standin:
        message = ('trainjobs.trainer.kubeflow.org is forbidden: User "dlc" cannot create resource '
                   '"secrets" in API group "" in the namespace "locked"')
        standin.refuse["locked"] = (403, "Forbidden", message)
        saved = os.environ.get("DLC_CLUSTERS")
        os.environ["DLC_CLUSTERS"] = str(root / "dlc_clusters.yaml")
        clusters.put_profile("my-k8s", {"engine": "kubernetes", "namespace": "ml",
                                        "kubeconfig": standin.kubeconfig(str(root / "kubeconfig")),
                                        "launcher_pvc_dir": str(pvc)})

        def on_launcher(launcher: LauncherEnv, options: dict) -> dict:
            # The pods reach the launcher at its own URL (a real cluster: its Service).
            return {"launcher_url": launcher.client.url}

        try:
            yield Cluster("k8s", "my-k8s", {"namespace": "locked"}, f"Kubernetes API 403: {message}",
                          on_launcher=on_launcher, objects={"standin": standin}, grace_by_engine=True)
        finally:
            if saved is None:
                os.environ.pop("DLC_CLUSTERS", None)
            else:
                os.environ["DLC_CLUSTERS"] = saved


KINDS: dict[str, Callable[[Path], contextlib.AbstractContextManager[Cluster]]] = {
    "local": _local, "slurm": _slurm, "ssh": _ssh, "k8s": _k8s}


# -- one configuration, up ------------------------------------------------------------------

@dataclass
class Rig:
    """One engine configuration with its launcher: what the scenarios submit to."""

    config: EngineConfig
    cluster: Cluster
    launcher: LauncherEnv
    profile: str | None  # what jobs name as `cluster` (None: the local engine)

    @property
    def client(self):
        return self.launcher.client

    def spec(self, **fields) -> dict:
        return dict(fields, cluster=self.profile) if self.profile else fields

    def capabilities(self) -> Capabilities:
        spec = JobSpec.from_dict(self.spec(script="train.py", nodes=2, nproc_per_node=2,
                                           engine=self.config.engine))
        return get_engine(self.config.engine).capabilities(spec)

    def refused_profile(self) -> str | None:
        """A profile whose submit the engine itself refuses (None: the engine has none)."""
        if self.cluster.refused is None:
            return None
        name = f"{self.profile}-refused"
        clusters.put_profile(name, dict(self._profile(), **self.cluster.refused))
        return name

    def _profile(self) -> dict:
        return dict(clusters.get_profile(self.profile).options, engine=self.config.engine)


def profile_options(rig_cluster: Cluster, config: EngineConfig, launcher: LauncherEnv) -> str | None:
    """The profile the configuration's jobs name: the base, or one of its own over it."""
    if rig_cluster.base is None:
        return None
    options = dict(config.options)
    if rig_cluster.on_launcher is not None:
        options.update(rig_cluster.on_launcher(launcher, options))
    if not options:
        return rig_cluster.base
    name = f"{config.id}-profile"
    base = clusters.get_profile(rig_cluster.base)
    clusters.put_profile(name, dict(base.options, engine=base.engine, **options))
    return name


def start_pool(rig: Rig) -> None:
    rig.client.pool_up(2, 2, **({"cluster": rig.profile} if rig.profile else {}))
    wait_for(lambda: [p for p in rig.client.pools() if p["state"] == "ready"], 180, what="pool ready")
