"""Cluster profiles and per-node resources: loading, validation, one-line errors (no cluster
needed; the Slurm engine itself is tested on a real cluster in test_slurm.py)."""

from __future__ import annotations

import argparse

import pytest

from jupyter_dlc import clusters
from jupyter_dlc.engines.contract import bind_cluster
from jupyter_dlc.spec import JOB_OPTIONS, JobSpec, SpecError, spec_from_options


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    path = tmp_path / "dlc_clusters.yaml"
    monkeypatch.setenv("DLC_CLUSTERS", str(path))
    return path


def test_profiles_round_trip_and_validate(profiles):
    clusters.put_profile("gpu", {"engine": "slurm", "partition": "a100", "time": 90,
                                 "sbatch_args": ["--exclusive"], "env": {"SLURM_CONF": "/x"}})
    clusters.put_profile("here", {"engine": "local"})
    loaded = clusters.load_profiles()
    assert sorted(loaded) == ["gpu", "here"]
    gpu = loaded["gpu"]
    assert gpu.engine == "slurm" and gpu.get("partition") == "a100" and gpu.get("time") == "90"
    assert gpu.env == {"SLURM_CONF": "/x"}
    clusters.remove_profile("here")
    assert sorted(clusters.load_profiles()) == ["gpu"]


@pytest.mark.parametrize(("text", "message"), [
    ("clusters:\n  a: {engine: pbs}\n", "a.engine: expected one of local, kubernetes, slurm, ssh, got 'pbs'"),
    ("clusters:\n  a: {engine: slurm, partiton: x}\n",
     "a.partiton: unknown option for engine slurm; known: "),
    ("clusters:\n  a: {engine: slurm, sbatch_args: --exclusive}\n",
     "a.sbatch_args: expected a list of strings, got '--exclusive'"),
    ("clusters:\n  a: {engine: local, partition: x}\n", "a.partition: unknown option for engine local"),
    ("clusters:\n  a: {engine: ssh, hosts: gpu1}\n",
     "a.hosts: expected a list of host names or addresses, node 0 first, got 'gpu1'"),
    ("clusters:\n  a: {engine: ssh, hosts: [gpu1], port: '22'}\n", "a.port: expected sshd's port, e.g. 22"),
    ("clusters:\n  a: {engine: ssh, hosts: [gpu1], port: true}\n", "a.port: expected sshd's port, e.g. 22"),
    ("clusters:\n  a: {engine: ssh, host: [gpu1]}\n", "a.host: unknown option for engine ssh; known: "),
    ("clusters: [1, 2]\n", "expected `clusters:` with one mapping per profile name"),
    ("clusters:\n  a: {engine: slurm\n", "not valid YAML"),
])
def test_bad_profiles_get_one_line_errors(profiles, text, message):
    profiles.write_text(text)
    with pytest.raises(clusters.ClusterError) as error:
        clusters.load_profiles()
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(str(profiles))


def test_unknown_cluster_names_the_known_ones(profiles):
    clusters.put_profile("gpu", {"engine": "slurm"})
    with pytest.raises(clusters.ClusterError, match=r"cluster: no profile named 'cpu' \(profiles: gpu\)"):
        bind_cluster(JobSpec.from_dict({"code": "x = 1", "cluster": "cpu"}))
    spec = bind_cluster(JobSpec.from_dict({"code": "x = 1", "cluster": "gpu"}))
    assert spec.engine == "slurm"
    with pytest.raises(SpecError, match="engine: 'kubernetes' conflicts with cluster 'gpu'"):
        bind_cluster(JobSpec.from_dict({"code": "x = 1", "cluster": "gpu", "engine": "kubernetes"}))
    # The old name of the field is still taken, with a deprecation note.
    with pytest.warns(DeprecationWarning, match="'backend' is now 'engine'"):
        old = JobSpec.from_dict({"code": "x = 1", "backend": "slurm"})
    assert old.engine == "slurm" and "backend" not in old.to_dict()
    with pytest.raises(SpecError, match="^engine: 'ssh' conflicts with backend 'slurm'"):
        JobSpec.from_dict({"code": "x = 1", "backend": "slurm", "engine": "ssh"})


def test_resources_are_validated_and_normalised():
    spec = JobSpec.from_dict({"code": "x = 1", "resources": {"gpus": 8, "cpus": 32, "memory": "64G"}})
    assert spec.resources == {"gpus": 8, "cpus": 32, "memory_mb": 65536}
    assert JobSpec.from_dict(spec.to_dict()).resources == spec.resources  # stored form reloads
    for resources, message in (({"gpus": -1}, "resources.gpus: must be between 0 and 64"),
                               ({"memory": "lots"}, "resources.memory: expected a size like 16G"),
                               ({"tpus": 1}, "resources.tpus: unknown resource; use gpus, cpus or memory")):
        with pytest.raises(SpecError, match=message):
            JobSpec.from_dict({"code": "x = 1", "resources": resources})
    with pytest.raises(SpecError, match="cluster: 'a b' is not a profile name"):
        JobSpec.from_dict({"code": "x = 1", "cluster": "a b"})


def test_cluster_and_resource_options_reach_the_spec():
    parser = argparse.ArgumentParser()
    for flags, kwargs in JOB_OPTIONS:
        parser.add_argument(*flags, **kwargs)
    options = parser.parse_args(["--cluster", "gpu", "--gpus-per-node", "4", "--memory-per-node", "16G"])
    spec = spec_from_options(options, code="x = 1")
    assert spec.cluster == "gpu" and spec.resources == {"gpus": 4, "memory_mb": 16384}


def test_local_engine_refuses_what_this_machine_lacks():
    from jupyter_dlc.engines.contract import get_engine

    local = get_engine("local")
    refusal = local.capacity_error(JobSpec.from_dict({"code": "x = 1", "resources": {"cpus": 4000}}))
    assert refusal.startswith("resources.cpus: 4000 CPUs per node but this machine has")


def test_network_names_a_profile_an_interface_or_both():
    from jupyter_dlc.spec import network_env

    tcp = network_env("tcp")
    assert tcp["NCCL_IB_DISABLE"] == "1" and tcp["NCCL_SOCKET_IFNAME"] == "lo" and "GLOO_SOCKET_IFNAME" not in tcp
    on_eth1 = network_env("tcp:eth1", "ib0")  # the job's interface wins over its cluster's
    assert on_eth1["NCCL_IB_DISABLE"] == "1"
    assert on_eth1["NCCL_SOCKET_IFNAME"] == on_eth1["GLOO_SOCKET_IFNAME"] == "eth1"
    only = network_env("eth1")
    assert only["NCCL_SOCKET_IFNAME"] == only["GLOO_SOCKET_IFNAME"] == "eth1" and "NCCL_IB_DISABLE" not in only
    profile = network_env(None, "dlc0")  # a cluster profile's `interface`
    assert profile["GLOO_SOCKET_IFNAME"] == "dlc0"
    for bad in ("tcp:", "eth1:tcp", "an-interface-name-too-long", "a b", 3):
        with pytest.raises(SpecError) as error:
            JobSpec.from_dict({"code": "print(1)", "network": bad})
        assert str(error.value).startswith("network: expected tcp, rdma, debug, an interface name")
    assert JobSpec.from_dict({"code": "print(1)", "network": "rdma:ib0"}).network == "rdma:ib0"
