"""The jupyter_dlc server extension, against a real Jupyter server and a real launcher.

A `jupyter server` subprocess runs under a non-root base_url with the extension enabled the
way a user enables it (jpserver_extensions); the launcher is the real one, started by the
extension itself on first use. Every route the extension registers (read back from the router
of a ServerApp that loaded the extension) is walked without credentials.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

BASE = "/user/alice/"
TOKEN = "test-token-" + os.urandom(4).hex()
EXT = "--ServerApp.jpserver_extensions={'jupyter_dlc': True}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, token=TOKEN, headers=None, timeout=30):
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"token {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def jget(url, **kw):
    status, raw = http("GET", url, **kw)
    return status, (json.loads(raw) if raw else None)


def connection_file(rt_dir):
    """The launcher's connection file in `rt_dir` (one per data dir; these tests use one)."""
    [name] = [n for n in os.listdir(rt_dir) if n.startswith("jupyter-dlc-launcher-") and n.endswith(".json")]
    return os.path.join(rt_dir, name)


def kill_launcher(rt_dir):
    """Stop the launcher a test caused to start (by its pid from the connection file)."""
    try:
        with open(connection_file(rt_dir)) as f:
            info = json.load(f)
        status, raw = http("GET", info["url"] + "/healthz", token=info["token"], timeout=3)
        pid = json.loads(raw)["pid"]
    except Exception:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return pid


@pytest.fixture(scope="module")
def server():
    tmp = tempfile.mkdtemp(prefix="dlc-srv-")
    env = dict(os.environ)
    env.update(
        JUPYTER_RUNTIME_DIR=os.path.join(tmp, "runtime"),
        JUPYTER_CONFIG_DIR=os.path.join(tmp, "config"),
        DLC_DATA_DIR=os.path.join(tmp, "data"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    for d in ("runtime", "config", "root"):
        os.makedirs(os.path.join(tmp, d))
    port = free_port()
    log = open(os.path.join(tmp, "server.log"), "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
         f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}",
         f"--ServerApp.base_url={BASE}", f"--ServerApp.root_dir={os.path.join(tmp, 'root')}",
         EXT],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}{BASE}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if http("GET", url + "api/status", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError(open(os.path.join(tmp, "server.log")).read())
    assert proc.poll() is None, open(os.path.join(tmp, "server.log")).read()
    yield {"url": url, "dlc": url + "dlc/", "env": env, "tmp": tmp, "port": port,
           "rt": env["JUPYTER_RUNTIME_DIR"]}
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    kill_launcher(env["JUPYTER_RUNTIME_DIR"])
    log.close()


@pytest.fixture(scope="module")
def registered_routes(tmp_path_factory):
    """The /dlc/ patterns jupyter_server really registers when it loads the extension."""
    d = tmp_path_factory.mktemp("routes")
    code = f"""
import json, os
os.environ["JUPYTER_RUNTIME_DIR"] = {str(d)!r}
from jupyter_server.serverapp import ServerApp
from tornado.web import RequestHandler
app = ServerApp()
app.initialize(argv=["--ServerApp.base_url={BASE}", "{EXT}", "--ServerApp.root_dir={d}",
                     "--ServerApp.open_browser=False"])
out = []
def walk(router):
    for rule in router.rules:
        if hasattr(rule.target, "rules"):
            walk(rule.target)
        else:
            h = rule.target
            implemented = [m for m in h.SUPPORTED_METHODS
                           if getattr(h, m.lower()) is not RequestHandler._unimplemented_method]
            out.append([rule.matcher.regex.pattern, h.__module__ + "." + h.__name__, implemented,
                        app.web_app._check_handler_auth(rule.matcher, h)])
walk(app.web_app.default_router)
print("ROUTES=" + json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JUPYTER_CONFIG_DIR=str(d)))
    line = [x for x in r.stdout.splitlines() if x.startswith("ROUTES=")]
    assert line, r.stderr[-3000:]
    routes = json.loads(line[0][len("ROUTES="):])
    return [r for r in routes if "/dlc" in r[0]]


# concrete paths to try for each registered pattern (group filled with a realistic value)
SAMPLES = {
    "api/(.*)$": ["api/jobs", "api/jobs/some-job", "api/jobs/some-job/stop", "api/jobs/x/logs",
                  "api/stream", "api/jobs/x/report"],
    "healthz$": ["healthz"],
    "stream$": ["stream"],
    "jobs/([^/]+)/metrics/stream$": ["jobs/x/metrics/stream", "jobs/last/metrics/stream"],
    "bokeh.json$": ["bokeh.json"],
    "static/bokeh/(.*)$": ["static/bokeh/bokeh.min.js", "static/bokeh/bokeh-widgets.min.js",
                           "static/bokeh/nonexistent.js"],
}


def test_package_import_stays_light():
    code = ("import sys, jupyter_dlc; "
            "pts = jupyter_dlc._jupyter_server_extension_points(); "
            "lab = jupyter_dlc._jupyter_labextension_paths(); "
            "heavy = [m for m in ('tornado', 'jupyter_server', 'torch', 'IPython') if m in sys.modules]; "
            "print(pts, lab, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "[{'module': 'jupyter_dlc.server'}]" in out
    assert "'dest': 'jupyter-dlc'" in out
    assert out.strip().endswith("[]"), out


def test_every_registered_dlc_route_refuses_requests_without_auth(server, registered_routes):
    patterns = [r[0] for r in registered_routes]
    implemented = {r[0]: set(r[2]) for r in registered_routes}
    assert patterns, "the extension registered no /dlc/ route"
    # jupyter_server's own audit: every implemented method is @web.authenticated
    assert [r[3] for r in registered_routes] == [[] for _ in registered_routes], registered_routes
    assert all(r[1].startswith("jupyter_dlc.server.") for r in registered_routes)
    # every registered route is under the non-root base_url, and every one has samples here
    assert all(p.startswith(BASE + "dlc/") for p in patterns), patterns
    covered = set()
    tried = 0
    for pattern in patterns:
        tail = pattern[len(BASE + "dlc/"):]
        assert tail in SAMPLES, f"new route {pattern}: add samples to this test"
        covered.add(tail)
        for sample in SAMPLES[tail]:
            assert re.fullmatch(pattern.rstrip("$"), BASE + "dlc/" + sample)
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
                body = {} if method in ("POST", "PUT", "PATCH") else None
                for token, extra in ((None, {}), ("wrong-token", {}),
                                     (None, {"Cookie": "username-127-0-0-1=forged"})):
                    status, raw = http(method, server["dlc"] + sample, body=body, token=token,
                                       headers=extra, timeout=10)
                    tried += 1
                    if method in implemented[pattern]:
                        assert status in (401, 403), (method, sample, token, status, raw[:200])
                    else:  # tornado refuses a method the handler lacks before anything runs
                        assert status in (401, 403, 405), (method, sample, status, raw[:200])
                        assert b"jobs" not in raw and b"pid" not in raw
    assert covered == set(SAMPLES)
    assert tried == 6 * 3 * sum(len(v) for v in SAMPLES.values())
    # ...and the same routes do answer with Jupyter's token (the refusals were about auth)
    assert jget(server["dlc"] + "healthz")[0] == 200
    assert http("GET", server["dlc"] + "static/bokeh/bokeh.min.js")[0] == 200


def test_routes_live_only_under_the_base_url(server):
    root = f"http://127.0.0.1:{server['port']}/dlc/"
    assert http("GET", root + "healthz")[0] == 404
    assert http("GET", root + "api/jobs")[0] == 404


def test_forwarding_to_a_real_launcher(server):
    dlc = server["dlc"]
    status, health = jget(dlc + "healthz")
    assert status == 200 and health["ok"] is True and isinstance(health["pid"], int)

    # a bad spec: the launcher's 400 and its one-line error come through unchanged
    status, raw = http("POST", dlc + "api/jobs", body={"name": "bad", "code": "pass", "nodes": 0})
    assert status == 400, raw
    assert "nodes" in json.loads(raw)["error"]

    code = "import sys, time\nprint('hello from', 'rank', flush=True)\ntime.sleep(0.5)\n"
    status, raw = http("POST", dlc + "api/jobs",
                       body={"name": "fwd", "code": code, "nodes": 1, "nproc_per_node": 1})
    assert status == 201, raw
    job = json.loads(raw)
    assert job["name"] == "fwd" and job["state"] in ("QUEUED", "PREFLIGHT", "STARTING", "RUNNING")
    jid = job["id"]

    status, listing = jget(dlc + "api/jobs")
    assert status == 200 and jid in [j["id"] for j in listing["jobs"]]

    # DELETE of an active job: the launcher's 409 comes through
    status, raw = http("DELETE", dlc + f"api/jobs/{jid}")
    assert status in (409, 204), raw  # 204 only if it already finished

    deadline = time.time() + 60
    while time.time() < deadline:
        status, j = jget(dlc + f"api/jobs/{jid}")
        if status == 404 or j["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.3)
    if status == 200:
        assert j["state"] == "SUCCEEDED", j
        # query parameters are forwarded
        status, logs = jget(dlc + f"api/jobs/{jid}/logs?tail=5&rank=0")
        assert status == 200
        assert any("hello from rank" in line["text"] for line in logs["lines"]), logs
        status, raw = http("DELETE", dlc + f"api/jobs/{jid}")
        assert status == 204 and raw == b""
    status, err = jget(dlc + f"api/jobs/{jid}")
    assert status == 404 and "error" in err


def test_stream_relays_launcher_events(server):
    dlc = server["dlc"]
    req = urllib.request.Request(dlc + "stream", headers={"Authorization": f"token {TOKEN}"})
    resp = urllib.request.urlopen(req, timeout=30)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    status, raw = http("POST", dlc + "api/jobs",
                       body={"name": "streamed", "code": "print(1)", "nodes": 1, "nproc_per_node": 1})
    assert status == 201
    jid = json.loads(raw)["id"]
    seen_states = []
    event = None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = resp.readline().decode().rstrip("\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event == "job":
            data = json.loads(line[5:])
            if data["id"] == jid:
                seen_states.append(data["state"])
                if data["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
                    break
    resp.close()
    assert seen_states and seen_states[-1] == "SUCCEEDED", seen_states
    assert len(set(seen_states)) >= 2, seen_states  # it saw the job change, live


METRICS_CODE = """import time
from jupyter_dlc import runtime
runtime.init()
for step in range(1, 31):
    runtime.log(step, loss=1.0 / step)
    time.sleep(0.05)
"""


def test_metrics_stream_relays_pushed_points(server):
    dlc = server["dlc"]
    status, raw = http("POST", dlc + "api/jobs",
                       body={"name": "pushed", "code": METRICS_CODE, "nodes": 1, "nproc_per_node": 1})
    assert status == 201, raw
    jid = json.loads(raw)["id"]
    req = urllib.request.Request(dlc + f"jobs/{jid}/metrics/stream?since=0",
                                 headers={"Authorization": f"token {TOKEN}"})
    resp = urllib.request.urlopen(req, timeout=30)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    steps, seqs, event = set(), [], None
    deadline = time.time() + 90
    while time.time() < deadline and len(steps) < 30:
        line = resp.readline().decode().rstrip("\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event == "metrics":
            data = json.loads(line[5:])
            seqs += [p["seq"] for p in data["points"]]
            steps |= {p["step"] for p in data["points"] if p["name"] == "loss"}
    resp.close()
    assert steps == set(range(1, 31)), sorted(steps)
    assert seqs == sorted(set(seqs)), "each point once, in seq order"
    # an unknown job: the launcher's 404 ends the relay with the launcher's reason
    req = urllib.request.Request(dlc + "jobs/no-such-job/metrics/stream",
                                 headers={"Authorization": f"token {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    assert "launcher answered 404" in text
    # a view's band read (bands.py) reaches the launcher whole: its check of `ranks` answers
    req = urllib.request.Request(dlc + f"jobs/{jid}/metrics/stream?since=0&band=1&ranks=1,x",
                                 headers={"Authorization": f"token {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    assert "launcher answered 400" in text and "ranks: " in text, text


def test_bokehjs_is_served_locally(server):
    import bokeh

    status, info = jget(server["dlc"] + "bokeh.json")
    assert status == 200 and info["version"] == bokeh.__version__
    assert info["js_urls"][0] == BASE + "dlc/static/bokeh/bokeh.min.js"
    origin = f"http://127.0.0.1:{server['port']}"
    for url in info["js_urls"]:
        status, raw = http("GET", origin + url)
        assert status == 200, url
    status, raw = http("GET", origin + info["js_urls"][0])
    assert bokeh.__version__.encode() in raw[:200000]
    assert http("GET", server["dlc"] + "static/bokeh/nonexistent.js")[0] == 404
    assert http("GET", server["dlc"] + "static/bokeh/../../../__init__.py")[0] in (403, 404)


def test_starts_the_launcher_when_none_answers_and_follows_a_restart(server):
    dlc = server["dlc"]
    status, first = jget(dlc + "healthz")
    assert status == 200
    old = kill_launcher(server["rt"])
    assert old == first["pid"]
    # the next request finds no launcher answering and starts a new one
    status, listing = jget(dlc + "api/jobs", timeout=60)
    assert status == 200 and "jobs" in listing
    status, second = jget(dlc + "healthz")
    assert status == 200 and second["pid"] != first["pid"]
    # the new launcher has a new token: the relay and the forwarder picked it up
    with open(connection_file(server["rt"])) as f:
        assert json.load(f)["token"]
    req = urllib.request.Request(dlc + "stream", headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        assert resp.readline().startswith(b"retry:")


def test_launcher_that_cannot_start_is_a_503_with_one_line(tmp_path):
    """No launcher can start (DLC_DATA_DIR is a file): the panel gets 503 and a reason."""
    bad = tmp_path / "not-a-dir"
    bad.write_text("x")
    port = free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), DLC_DATA_DIR=str(bad),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={port}",
         "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.base_url={BASE}",
         f"--ServerApp.root_dir={tmp_path}", EXT],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}{BASE}"
        for _ in range(300):
            try:
                if http("GET", url + "api/status", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        status, data = jget(url + "dlc/api/jobs", timeout=90)
        assert status == 503, data
        assert data["launcher"] == "down" and "\n" not in data["error"]
        status, raw = http("GET", url + "dlc/stream", timeout=90)
        assert status == 503
    finally:
        proc.terminate()
        proc.wait(10)
