"""Every generated script, run for real with hostile values in every field that reaches it.

Newlines, `$()`, backticks, quotes, `}`, spaces, `#` and leading dashes go into the spec's
args, env values, workdir and python path, and into a Slurm profile's options; each script
(an export's run.sh, job.sbatch and Kubernetes pod command; the Slurm engine's batch script
with its node reporter; ssh command lines) is run by a real shell, real torchrun, real
sbatch on a local Slurm cluster (scripts/local-slurm.sh, controller port 17117) and real
ssh. Each rank writes what it got (argv, env, cwd, umask) into its job directory: the values
must arrive exactly as written, and no marker file may appear. What cannot be written safely
(a control character on an `#SBATCH` line, an ssh host that ssh reads as an option) is
refused with one line naming the field.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from conftest import LauncherEnv, wait_for
from test_export import clean_env, free_port
from test_slurm import local_slurm

from jupyter_dlc import clusters, shell
from jupyter_dlc.client import LauncherError
from jupyter_dlc.export import export_bundle
from jupyter_dlc.spec import JobSpec, SpecError

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARK = "pwned"
# Each value is one shell trap; `{m}` is the marker file's path.
NASTY = ["$(touch {m}-subst)", "`touch {m}-tick`", "it's", 'say "hi"', "a}b$c", "a b  c",
         "--leading-dash", "-x", "line\nbreak\n#SBATCH --x", "back\\slash", "#hash", "${HOME}",
         "*", "", "semi; touch {m}-semi", "tab\there", "}'\"`$"]
# A directory name and a python file name that hold the same traps (no `/`, no newline).
NASTY_DIR = "w d $(touch pwned-dir) `touch pwned-dtick` 'q' \"dq\" }#x"
NASTY_PYTHON = "py thon$(touch pwned-py)`touch pwned-pytick`'q'\"dq\"}"
# What talks to the launcher: its URL, the job token, and the key its answers must prove.
LAUNCHER_ONLY = {"DLC_LAUNCHER_URL", "DLC_TOKEN", "DLC_LAUNCHER_PROOF"}

SEEN = """\
import json, os, sys
mask = os.umask(0)
os.umask(mask)
seen = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask}
path = os.path.join(os.environ["DLC_JOB_DIR"], "seen-%s.json" % os.environ.get("RANK", "x"))
with open(path + ".tmp", "w") as f:
    json.dump(seen, f)
os.replace(path + ".tmp", path)
"""


def hostile(root: pathlib.Path) -> dict:
    """Args, env values, workdir and python of a spec, every one a trap; markers under root."""
    marker = str(root / MARK)
    values = [v.replace("{m}", marker) for v in NASTY]
    workdir = root / NASTY_DIR
    workdir.mkdir(exist_ok=True)
    bin_dir = root / "b in"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / NASTY_PYTHON
    python.write_text(f"#!/bin/sh\nexec {shell.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)
    return {"args": values, "env": {f"ODD_{i}": v for i, v in enumerate(values)},
            "workdir": str(workdir), "python": str(python)}


def markers(*dirs) -> list[str]:
    found = []
    for folder in {pathlib.Path(d) for d in dirs}:
        found += [str(p) for p in folder.rglob(f"{MARK}*")] if folder.is_dir() else []
    return found


def assert_intact(seen: dict, values: dict, workdir: str | None = None) -> None:
    assert seen["argv"] == values["args"]
    for key, value in values["env"].items():
        assert seen["env"].get(key) == value, key
    if workdir:
        assert seen["cwd"] == workdir


def read_seen(folder, ranks: int) -> dict[int, dict]:
    out = {}
    for rank in range(ranks):
        with open(os.path.join(folder, f"seen-{rank}.json")) as f:
            out[rank] = json.load(f)
    return out


def documented_env() -> set[str]:
    """The variables README's "The environment every rank gets" says torchrun and the
    launcher give every rank."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The environment every rank gets", 1)[1]
    given = section.split("- Not inherited", 1)[0]
    names = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", given))
    assert {"RANK", "DLC_JOB_ID", "DLC_TOKEN", "DLC_NODE_COPY"} <= names, names
    return names


def bundle(tmp_path, values: dict, **spec) -> pathlib.Path:
    dest = tmp_path / "bundle"
    export_bundle(dict({"name": "nasty", "code": SEEN, **values}, **spec), SEEN, str(dest),
                  files={}, job_id="nasty-0042")
    return dest


# -- run.sh -----------------------------------------------------------------------------------

def test_run_sh_runs_no_value_and_passes_each_intact(tmp_path):
    """Real run.sh, real torchrun (through the hostile python path), one node of 2 ranks."""
    values = hostile(tmp_path)
    dest = bundle(tmp_path, values, nproc_per_node=2)
    proc = subprocess.run([str(dest / "run.sh"), "0"], cwd=tmp_path, capture_output=True, text=True,
                          env=clean_env(MASTER_PORT=str(free_port())), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert markers(tmp_path, dest, values["workdir"]) == []
    for rank, seen in read_seen(dest, 2).items():
        assert_intact(seen, values, values["workdir"])
        # The documented contract, less only what talks to the launcher (issue 21).
        missing = documented_env() - LAUNCHER_ONLY - set(seen["env"])
        assert not missing, f"rank {rank} lacks {sorted(missing)}"
        assert seen["env"]["DLC_JOB_ID"] == "nasty-0042" and seen["env"]["DLC_JOB_DIR"] == str(dest)
        assert seen["env"]["DLC_NODE_RANK"] == "0" and seen["env"]["DLC_RESUME_PATH"] == ""


def test_run_sh_defaults_give_way_to_the_callers_environment(tmp_path):
    """A value already set wins, even one that is itself hostile."""
    values = hostile(tmp_path)
    dest = bundle(tmp_path, values)
    mine = "$(touch " + str(tmp_path / MARK) + "-mine)}"
    proc = subprocess.run([str(dest / "run.sh"), "0"], cwd=tmp_path, capture_output=True, text=True,
                          env=clean_env(MASTER_PORT=str(free_port()), ODD_0=mine, DLC_JOB_NAME="",
                                        DLC_WORKDIR=str(tmp_path)), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = read_seen(dest, 1)[0]
    assert seen["env"]["ODD_0"] == mine and seen["env"]["DLC_JOB_NAME"] == "" and seen["cwd"] == str(tmp_path)
    assert markers(tmp_path) == []


# -- Kubernetes pod command -------------------------------------------------------------------

def test_k8s_pod_command_passes_each_value_intact(tmp_path):
    """The exported Indexed Job's container command, run by /bin/sh as its pod would run it
    (the pod's /dlc moved under tmp_path, `python` the hostile wrapper)."""
    values = hostile(tmp_path)
    dest = bundle(tmp_path, values)
    job = next(yaml.safe_load(p.read_text()) for p in sorted((dest / "k8s").glob("*.yaml"))
               if yaml.safe_load(p.read_text())["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    pod = tmp_path / "pod"

    def in_pod(text: str) -> str:
        return text.replace("/dlc", str(pod))

    (pod / "job").mkdir(parents=True)
    (pod / "job" / "script.py").write_text(SEEN)
    env = {e["name"]: in_pod(e["value"]) for e in container["env"] if "value" in e}
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "python").symlink_to(values["python"])
    env.update(PET_NNODES="1", PET_NODE_RANK="0", PET_MASTER_ADDR="127.0.0.1",
               PET_MASTER_PORT=str(free_port()), PATH=f"{tmp_path / 'image'}:{os.environ['PATH']}",
               HOME=str(tmp_path))
    command = [in_pod(w) for w in container["command"]] + container.get("args", [])
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert markers(tmp_path) == []
    seen = read_seen(pod / "job", 1)[0]
    assert_intact(seen, values)
    missing = documented_env() - LAUNCHER_ONLY - set(seen["env"])
    assert not missing, f"the pod lacks {sorted(missing)}"
    assert seen["env"]["DLC_JOB_ID"] == "nasty-0042"


# -- refusals that need no cluster -------------------------------------------------------------

@pytest.mark.parametrize("field", ["workdir", "python", "checkpoint_dir"])
def test_a_path_with_a_newline_is_refused_in_one_line(tmp_path, field):
    bad = f"{tmp_path}/wd\ntouch {tmp_path}/{MARK}\n#"
    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict({"code": "pass", field: bad})
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{field}: contains a control character (\\n)")
    assert "without newlines" in message


@pytest.mark.parametrize("key", ["partition", "account", "qos", "time", "gres", "constraint",
                                 "sbatch_args"])
def test_a_slurm_option_with_a_newline_is_refused_naming_it(key):
    value = "x\ntouch pwned"
    with pytest.raises(clusters.ClusterError) as caught:
        clusters._validate("gpu", {"engine": "slurm", key: [value] if key == "sbatch_args" else value},
                           "dlc_clusters.yaml")
    message = str(caught.value)
    at = f"gpu.{key}[0]" if key == "sbatch_args" else f"gpu.{key}"
    assert "\n" not in message
    assert message.startswith(f"dlc_clusters.yaml: {at}: contains a control character (\\n)")
    assert message.endswith("write it on one line")


def test_directives_quote_spaces_and_refuse_control_characters():
    """What goes on an #SBATCH line: the engine's own check, behind the spec's and profile's."""
    assert shell.directive("chdir", "/w d", "workdir") == '--chdir="/w d"'
    assert shell.directive("comment", 'a"b\\c#', "x") == '--comment="a\\"b\\\\c#"'
    assert shell.directive("partition", "debug", "x") == "--partition=debug"
    with pytest.raises(shell.UnsafeValue, match=r"^output: contains a control character \(\\r\)"):
        shell.directive("output", "/a\rb", "output")


# -- ssh ---------------------------------------------------------------------------------------

def write_profiles(path: pathlib.Path, profiles: dict) -> None:
    path.write_text(yaml.safe_dump({"clusters": profiles}))


@pytest.mark.parametrize("host", ["-oProxyCommand=touch {m}", "gpu1 -oProxyCommand=touch {m}",
                                  "gpu1\n-oProxyCommand=touch {m}"])
def test_jupyter_dlc_clusters_refuses_an_ssh_host_ssh_would_read_as_an_option(tmp_path, host):
    """Plain `jupyter-dlc clusters` used to run the ProxyCommand; now the profile is refused."""
    host = host.replace("{m}", str(tmp_path / MARK))
    path = tmp_path / "dlc_clusters.yaml"
    write_profiles(path, {"boxes": {"engine": "ssh", "hosts": ["gpu0", host]}})
    proc = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "clusters"], capture_output=True,
                          text=True, env=dict(os.environ, DLC_CLUSTERS=str(path)), timeout=60)
    assert markers(tmp_path) == []
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0 and len(out.splitlines()) == 1, out
    assert f"{path}: boxes.hosts[1]: " in out and "give a host name or address" in out


def test_ssh_reads_the_host_after_dashes_as_a_host(tmp_path, monkeypatch):
    """Behind the profile check, every ssh command line has `--` before the host: real ssh,
    given `-oProxyCommand=...` there, tries to resolve it as a name and runs nothing."""
    from jupyter_dlc.engines.ssh import engine as ssh

    monkeypatch.setattr(shell, "host_error", lambda host: None)  # past the profile's check
    argv = ssh.ssh_argv(clusters.Profile("boxes", "ssh", {}),
                        f"-oProxyCommand=touch {tmp_path / MARK}", ["python3", "-c", "print(1)"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and markers(tmp_path) == [], proc.stderr
    assert argv[-5:-3] == ["--", f"-oProxyCommand=touch {tmp_path / MARK}"]


# -- Slurm, for real -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm"), "17117") as client_env:
        yield client_env


USER_UMASK = 0o027


@pytest.fixture(scope="module")
def launcher(slurm, tmp_path_factory):
    # Started under a umask of the user's own: the ranks must get it, not the launcher's 077.
    old = os.umask(USER_UMASK)
    try:
        env = LauncherEnv(str(tmp_path_factory.mktemp("launcher")))
    finally:
        os.umask(old)
    yield env
    env.close()


def local_profile() -> dict:
    return dict(clusters.get_profile("local-slurm").options, engine="slurm")


def test_slurm_engine_runs_no_value_and_passes_each_intact(launcher, tmp_path):
    """The engine's batch script (#SBATCH lines from a hostile workdir and profile options,
    the node reporter started with a hostile python path) on real sbatch: 1 node x 2 ranks."""
    values = hostile(tmp_path)
    comment = "a b 'c' \"d\" #e \\f $(touch " + str(tmp_path / MARK) + "-comment)"
    clusters.put_profile("nasty-slurm", dict(local_profile(), sbatch_args=[f"--comment={comment}"]))
    script = launcher.script("seen.py", SEEN)
    job = launcher.client.submit(dict(values, script=script, cluster="nasty-slurm", nproc_per_node=2))
    job = launcher.client.wait(job["id"], timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert markers(tmp_path, job["job_dir"]) == []
    batch = (pathlib.Path(job["job_dir"]) / "attempt-1" / "job.sbatch").read_text()
    assert "#SBATCH --chdir=" + shell.sbatch_quote(values["workdir"]) + "\n" in batch
    assert "#SBATCH " + shell.sbatch_quote(f"--comment={comment}") + "\n" in batch
    for seen in read_seen(job["job_dir"], 2).values():
        assert_intact(seen, values, values["workdir"])
        assert seen["env"]["DLC_NODE_REPORTER"]  # started by the task's shell line
        assert seen["umask"] == USER_UMASK  # the user's, as local ranks get it


def test_slurm_refuses_a_newline_on_an_sbatch_line_at_submit(launcher, slurm, tmp_path):
    """Issue 26's reproductions: a workdir, and a profile's sbatch_args, with a newline."""
    script = launcher.script("seen.py", SEEN)
    workdir = f"{tmp_path}/wd\ntouch {tmp_path}/{MARK}\n#"
    with pytest.raises(SpecError, match=r"^workdir: contains a control character \(\\n\)"):
        launcher.client.submit({"script": script, "cluster": "local-slurm", "workdir": workdir})
    # The launcher answers the same 400 to a client that does not check first.
    with pytest.raises(LauncherError) as caught:
        launcher.client.request("POST", "/api/jobs", body={"script": script, "cluster": "local-slurm",
                                                           "workdir": workdir})
    assert caught.value.status == 400 and "\n" not in str(caught.value)
    assert "workdir: contains a control character (\\n)" in str(caught.value)

    path = os.environ["DLC_CLUSTERS"]
    saved = pathlib.Path(path).read_text()
    profiles = yaml.safe_load(saved)["clusters"]
    profiles["bad-slurm"] = dict(local_profile(), sbatch_args=[f"--comment=x\ntouch {tmp_path}/{MARK}"])
    try:
        write_profiles(pathlib.Path(path), profiles)
        with pytest.raises(LauncherError) as caught:
            launcher.client.submit({"script": script, "cluster": "bad-slurm"})
        assert caught.value.status == 400 and "\n" not in str(caught.value)
        assert f"{path}: bad-slurm.sbatch_args[0]: contains a control character (\\n)" in str(caught.value)
        listing = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "clusters"], capture_output=True,
                                 text=True, timeout=60)
        out = (listing.stdout + listing.stderr).strip()
        assert listing.returncode != 0 and len(out.splitlines()) == 1 and "bad-slurm.sbatch_args[0]" in out
    finally:
        pathlib.Path(path).write_text(saved)
    assert markers(tmp_path) == []


def test_exported_job_sbatch_runs_no_value_and_passes_each_intact(slurm, tmp_path):
    """The bundle's job.sbatch under plain sbatch, 2 nodes x 1 rank, plain torchrun."""
    values = hostile(tmp_path)
    dest = bundle(tmp_path, values, nodes=2)
    env = clean_env(SLURM_CONF=slurm["SLURM_CONF"], MASTER_PORT=str(free_port()))
    out = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=dest, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    slurm_id = out.strip().split(";")[0]

    def ended() -> bool:
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True,
                               check=True).stdout.split()
        return slurm_id not in queue

    wait_for(ended, 240, interval=0.5, what=f"Slurm job {slurm_id} ended")
    logs = "".join(p.read_text() for p in dest.glob("slurm-*.out")) + \
        "".join(p.read_text() for p in (dest / "logs").glob("*.log"))
    assert markers(tmp_path, dest) == [], logs
    seen = read_seen(dest, 2)
    for rank, got in seen.items():
        assert_intact(got, values)
        assert got["env"]["DLC_NODE_RANK"] == str(rank)
        missing = documented_env() - LAUNCHER_ONLY - set(got["env"])
        assert not missing, f"rank {rank} lacks {sorted(missing)}"
        assert got["env"]["DLC_JOB_ID"] == "nasty-0042"
