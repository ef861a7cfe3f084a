"""Tokens and isolation against a real launcher: owner-only files whatever the umask, only
hashes of job tokens stored, no token in the log, ranks that cannot find the launcher's
connection file nor control another job, one launcher per data dir."""

from __future__ import annotations

import json
import os
import signal
import sqlite3

import pytest
from conftest import LauncherEnv, wait_for

from jupyter_dlc import paths
from jupyter_dlc.client import LauncherClient, LauncherError

PRINT_TOKEN = """
import os
print("TOKEN", os.environ["DLC_TOKEN"], flush=True)
"""

SLEEPER = """
import time
while True:
    time.sleep(0.1)
"""

# A job that goes looking for the launcher the ways a script could: its environment, the
# connection file where paths.py would look, and its own token against another job.
INTRUDER = """
import json, os, sys, urllib.request, urllib.error
from jupyter_dlc import paths
other = sys.argv[1]
seen = {k: os.environ[k] for k in os.environ if k.startswith(("JUPYTER_", "DLC_DATA", "JPY_"))}
tokens = {"own": os.environ["DLC_TOKEN"]}
try:
    with open(paths.connection_file()) as f:
        tokens["connection file"] = json.load(f)["token"]
except OSError as error:
    seen["connection file"] = f"not found: {error.strerror}"
answers = {}
for label, token in tokens.items():
    for method, route in (("POST", "stop"), ("GET", "logs")):
        request = urllib.request.Request(f"{os.environ['DLC_LAUNCHER_URL']}/api/jobs/{other}/{route}",
                                         data=b"{}" if method == "POST" else None, method=method,
                                         headers={"Authorization": f"token {token}"})
        try:
            answers[f"{label} {route}"] = urllib.request.urlopen(request, timeout=10).status
        except urllib.error.HTTPError as error:
            answers[f"{label} {route}"] = error.code
print("INTRUDER " + json.dumps({"env": seen, "answers": answers}), flush=True)
"""


@pytest.fixture
def permissive_launcher(tmp_path):
    """A launcher started (data dir and log made by the client) under umask 000."""
    old = os.umask(0)
    try:
        env = LauncherEnv(str(tmp_path))
    finally:
        os.umask(old)
    yield env
    env.close()


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


def test_files_are_private_and_tokens_hashed_and_redacted(permissive_launcher):
    launcher = permissive_launcher
    client = launcher.client
    job = client.submit({"script": launcher.script("tok.py", PRINT_TOKEN), "name": "tok"})
    job = client.wait(job["id"], timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    [token] = [line["text"].split()[1] for line in client.logs(job["id"])["lines"]
               if line["text"].startswith("TOKEN ")]

    data = launcher.data_dir
    assert mode(data) == 0o700
    assert mode(os.path.join(data, "jobs")) == 0o700 and mode(job["job_dir"]) == 0o700
    for name in ("launcher.sqlite", "launcher.log", "launcher.port", "launcher.lock"):
        assert mode(os.path.join(data, name)) == 0o600, name
    for name in ("script.py", "spec.json"):
        assert mode(os.path.join(job["job_dir"], name)) == 0o600, name
    assert mode(paths.connection_file(data, launcher.runtime_dir)) == 0o600

    # The store holds a hash of the job token, never the token.
    db = sqlite3.connect(os.path.join(data, "launcher.sqlite"))
    stored = db.execute("SELECT token FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0]
    db.close()
    assert stored.startswith("sha256:") and token not in stored
    for name in os.listdir(data):
        if name.startswith("launcher.sqlite"):
            with open(os.path.join(data, name), "rb") as f:
                assert token.encode() not in f.read(), name

    # tornado logs the URI of every 4xx: with the token in the query, it must not reach the log.
    with pytest.raises(LauncherError) as refused:
        client.request("GET", f"/api/jobs/no-such-job?token={client.token}")
    assert refused.value.status == 404
    log = os.path.join(data, "launcher.log")
    wait_for(lambda: "no-such-job" in read(log), timeout=10, what="the 404 to be logged")
    text = read(log)
    assert client.token not in text and "token=[redacted]" in text


def test_a_job_cannot_find_the_launcher_nor_control_another_job(launcher):
    client = launcher.client
    victim = client.submit({"script": launcher.script("sleeper.py", SLEEPER), "name": "victim"})
    wait_for(lambda: client.job(victim["id"])["state"] == "RUNNING", timeout=90, what="victim RUNNING")
    intruder = client.submit({"script": launcher.script("intruder.py", INTRUDER), "name": "intruder",
                              "args": [victim["id"]]})
    intruder = client.wait(intruder["id"], timeout=120)
    assert intruder["state"] == "SUCCEEDED", intruder["reason"]
    [report] = [json.loads(line["text"][9:]) for line in client.logs(intruder["id"])["lines"]
                if line["text"].startswith("INTRUDER ")]
    assert set(report["env"]) <= {"connection file"}, report  # nothing that locates it
    # Where it would look, there is no file of this launcher (at most one of a launcher of
    # the default data dir, if this machine runs one: its token is no good here either).
    assert {"own stop", "own logs"} <= set(report["answers"])
    assert set(report["answers"].values()) == {401}, report
    assert client.job(victim["id"])["state"] == "RUNNING"
    client.stop(victim["id"], grace=0)


def test_two_data_dirs_in_one_runtime_dir_get_two_launchers(tmp_path, monkeypatch):
    runtime = str(tmp_path / "runtime")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", runtime)
    clients = {}
    try:
        for name in ("a", "b"):
            monkeypatch.setenv("DLC_DATA_DIR", str(tmp_path / name))
            clients[name] = LauncherClient.connect()
        pids = {name: c.request("GET", "/healthz")[1]["pid"] for name, c in clients.items()}
        assert pids["a"] != pids["b"], "the second data dir attached to the first launcher"
        job = clients["b"].submit({"code": "print('b')", "name": "inb"})
        assert job["job_dir"].startswith(str(tmp_path / "b") + os.sep)
        assert clients["b"].wait(job["id"], timeout=120)["state"] == "SUCCEEDED"
        with pytest.raises(LauncherError):
            clients["a"].job(job["id"])
    finally:
        for c in clients.values():
            try:
                os.kill(c.request("GET", "/healthz", timeout=3)[1]["pid"], signal.SIGTERM)
            except (LauncherError, OSError):
                pass
