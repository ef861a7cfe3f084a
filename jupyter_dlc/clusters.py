"""Cluster profiles: named places a job can run, read from `dlc_clusters.yaml`.

```yaml
clusters:
  local-slurm:
    engine: slurm
    partition: debug
    time: 1h
    env: {SLURM_CONF: /tmp/dlc-slurm/slurm.conf}
  gpu-boxes:
    engine: ssh
    hosts: [gpu1, gpu2]
    key: ~/.ssh/id_ed25519
    shared_filesystem: true
  my-k8s:
    engine: kubernetes
    namespace: ml
    image: ghcr.io/me/train:latest
    pvc: dlc-checkpoints
```

The file is `$DLC_CLUSTERS` when set, else the first `dlc_clusters.yaml` on Jupyter's config
path (new profiles are written to Jupyter's config dir). Every error is one line naming the
profile and the field. `python -m jupyter_dlc.clusters put NAME JSON | remove NAME` edits the
file from scripts (scripts/local-slurm.sh writes its profile so).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import layout, shell
from . import engine_registry
from .engine_registry import Option

FILE_NAME = "dlc_clusters.yaml"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

# Options every engine understands; each engine declares its own (`profile_options` on its
# class, read through the registry: engines.py).
COMMON_OPTIONS = {
    "engine": Option(str, "an engine's name (jupyter-dlc clusters lists them)"),
    "env": Option(dict, "a mapping of variable to value, e.g. {SLURM_CONF: /etc/slurm/slurm.conf}"),
    "python": Option(str, "the Python with torch and jupyter-dlc on the nodes"),
    "interface": Option(str, "a network interface name, e.g. eth0 (sets GLOO_/NCCL_SOCKET_IFNAME)"),
    "description": Option(str, "a line of text"),
    # Warm pools (launcher/pools.py): the first job of a shape starts one.
    "pool": Option(bool, "true to keep a warm pool per shape after its first job"),
    "pool_idle_timeout": Option(str, "a duration like 10m: idle time before the pool is released")}


def options_of(engine: str) -> dict[str, Option]:
    """Every option a profile of `engine` may give."""
    return dict(COMMON_OPTIONS, **engine_registry.profile_options(engine))


def profile_schema() -> dict[str, Any]:
    """A profile of `dlc_clusters.yaml` as JSON Schema, one branch an engine, from the same
    declarations `_validate` checks (the OpenAPI document's ClusterProfile)."""
    branches = []
    for engine in engine_registry.names():
        properties: dict[str, Any] = {k: option.schema() for k, option in options_of(engine).items()}
        properties["engine"] = {"const": engine}
        properties["env"]["additionalProperties"] = {"type": "string"}
        branches.append({"type": "object", "title": engine, "required": ["engine"],
                         "additionalProperties": False, "properties": properties})
    return {"oneOf": branches, "description": "One profile of dlc_clusters.yaml (clusters.py); "
                                              "the file maps profile names to these"}


class ClusterError(ValueError):
    """One line: `<file>: <profile>.<field>: what is wrong; what to write`."""


@dataclass
class Profile:
    name: str
    engine: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.options.get("env") or {})

    def get(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


def profiles_path(for_writing: bool = False) -> str:
    if os.environ.get("DLC_CLUSTERS"):
        return os.path.abspath(os.environ["DLC_CLUSTERS"])
    from jupyter_core.paths import jupyter_config_dir, jupyter_config_path

    if not for_writing:
        for folder in jupyter_config_path():
            candidate = os.path.join(folder, FILE_NAME)
            if os.path.isfile(candidate):
                return candidate
    return os.path.join(jupyter_config_dir(), FILE_NAME)


def _validate(name: str, data: Any, where: str) -> Profile:
    if not _NAME.match(str(name)):
        raise ClusterError(f"{where}: {name!r}: a profile name uses letters, digits, '.', '_' and '-'")
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: {name}: expected a mapping of options, e.g. {{engine: slurm}}")
    engine = data.get("engine")
    if not isinstance(engine, str) or engine not in engine_registry.names():
        raise ClusterError(f"{where}: {name}.engine: expected one of {', '.join(engine_registry.names())}, "
                           f"got {engine!r}")
    known = options_of(engine)
    for key, value in data.items():
        if key not in known:
            raise ClusterError(f"{where}: {name}.{key}: unknown option for engine {engine}; "
                               f"known: {', '.join(sorted(known))}")
        option = known[key]
        if value is None:
            continue
        if option.number_as_text and isinstance(value, int) and not isinstance(value, bool):
            value = data[key] = str(value)
        if not isinstance(value, option.kind) or (isinstance(value, bool) and option.kind is not bool) or \
                (isinstance(value, list) and not all(isinstance(v, option.items) for v in value)):
            raise ClusterError(f"{where}: {name}.{key}: expected {option.expected}, got {value!r}")
        if option.choices and value not in option.choices:
            raise ClusterError(f"{where}: {name}.{key}: expected one of {', '.join(option.choices)}, "
                               f"got {value!r}")
        if key == "env" and isinstance(value, dict):
            data[key] = {str(k): str(v) for k, v in value.items()}
        _check_script_safe(name, key, value, where)
    return Profile(str(name), engine, {k: v for k, v in data.items() if k != "engine"})


def _check_script_safe(name: str, key: str, value: Any, where: str) -> None:
    """Options end up in scripts (`#SBATCH` lines, ssh command lines): a value with a
    control character is refused, as is an ssh host that ssh would read as an option."""
    items = value if isinstance(value, list) else [value]
    for index, item in enumerate(items):
        if not isinstance(item, str):
            continue
        at = f"{name}.{key}" + (f"[{index}]" if isinstance(value, list) else "")
        if key == "hosts":
            error = shell.host_error(item)
            if error:
                raise ClusterError(f"{where}: {at}: {error}; give a host name or address")
        try:
            shell.refuse_control(item, at, "write it on one line")
        except shell.UnsafeValue as error:
            raise ClusterError(f"{where}: {error}") from None


def _read(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as error:
        raise ClusterError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("clusters", {}), dict):
        raise ClusterError(f"{path}: expected `clusters:` with one mapping per profile name")
    return data.get("clusters") or {}


def load_profiles() -> dict[str, Profile]:
    path = profiles_path()
    return {name: _validate(name, dict(options or {}), path) for name, options in _read(path).items()}


def get_profile(name: str) -> Profile:
    profiles = load_profiles()
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or f"none yet; add one to {profiles_path()}"
        raise ClusterError(f"cluster: no profile named {name!r} (profiles: {known})")
    return profiles[name]


def engine_profile(cluster: str | None, engine: str, lenient: bool = False) -> Profile:
    """The profile named `cluster` for `engine`; an empty one (the engine's defaults) when the
    job names none, or, with `lenient` (an export, made where the profile may not exist or
    is for another engine), when it is missing or for another engine."""
    default = Profile(engine, engine, {})
    if not cluster:
        return default
    try:
        profile = get_profile(cluster)
    except ClusterError:
        if lenient:
            return default
        raise
    return profile if profile.engine == engine or not lenient else default


def put_profile(name: str, options: dict[str, Any]) -> str:
    """Add or replace one profile; returns the file written."""
    path = profiles_path(for_writing=True)
    _validate(name, dict(options), path)
    clusters = _read(path)
    clusters[name] = options
    _write(path, clusters)
    return path


def remove_profile(name: str) -> str:
    path = profiles_path(for_writing=True)
    clusters = _read(path)
    if clusters.pop(name, None) is not None:
        _write(path, clusters)
    return path


def _write(path: str, clusters: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    layout.write_atomic(path, "# jupyter-dlc cluster profiles (see README, Clusters)\n"
                        + yaml.safe_dump({"clusters": clusters}, sort_keys=False))


def clusters_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"no cluster profiles (add them to {profiles_path(for_writing=True)})"
    lines = [f"{'NAME':<16} {'ENGINE':<8} {'OK':<4} {'IDLE':>5} {'GPUS':>5}  DETAIL"]
    for row in rows:
        idle = "-" if row.get("idle_nodes") is None else str(row["idle_nodes"])
        gpus = "-" if row.get("gpus") is None else str(row["gpus"])
        lines.append(f"{row['name']:<16} {row['engine']:<8} {'yes' if row['ok'] else 'NO':<4} "
                     f"{idle:>5} {gpus:>5}  {row.get('detail', '')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    usage = "usage: python -m jupyter_dlc.clusters put NAME JSON | remove NAME | path (checks: jupyter-dlc clusters)"
    try:
        if argv[:1] == ["put"] and len(argv) == 3:
            print(put_profile(argv[1], json.loads(argv[2])))
        elif argv[:1] == ["remove"] and len(argv) == 2:
            print(remove_profile(argv[1]))
        elif argv == ["path"]:
            print(profiles_path())
        else:
            print(usage, file=sys.stderr)
            return 2
    except (ClusterError, ValueError) as error:
        print(f"clusters: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
