"""Bad input at the launcher's API (issue 12, "Input"): every reproduction answers a one-line
4xx naming the field, stores nothing, and leaves the launcher serving. A real launcher on
loopback, real HTTP, a real (tiny) job for the routes that need one."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from conftest import wait_for


def raw(launcher, method: str, path: str, body: bytes | None = None,
        headers: dict | None = None) -> tuple[int, str]:
    """(status, text) for a request with exactly these bytes as its body."""
    req = urllib.request.Request(launcher.client.url + path, data=body, method=method, headers={
        "Authorization": f"token {launcher.client.token}", "Content-Type": "application/json",
        **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(launcher, path: str, body) -> tuple[int, str]:
    return raw(launcher, "POST", path, json.dumps(body).encode())


def one_line_error(status: int, text: str, expected_status: int, field: str) -> str:
    assert status == expected_status, (status, text[:300])
    message = json.loads(text)["error"]
    assert "\n" not in message and message.startswith(field), message
    assert len(message) < 400, len(message)
    return message


@pytest.fixture(scope="module")
def api(shared_launcher):
    """The shared launcher, a script, and one ended 1x4 job (a world of 4)."""
    script = shared_launcher.script("quick.py", "print('hello from a rank')\n")
    job = shared_launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 4,
                                         "max_restarts": 0})
    job = shared_launcher.client.wait(job["id"], timeout=180)
    shared_launcher.job = job
    shared_launcher.quick = script
    return shared_launcher


def job_dirs(launcher) -> set[str]:
    jobs = os.path.join(launcher.data_dir, "jobs")
    return set(os.listdir(jobs)) if os.path.isdir(jobs) else set()


SPEC_CASES = [
    # (what the spec gets, the field the error must name)
    ({"script": 5}, "script: expected a path"),
    ({"checkpoint_dir": 123}, "checkpoint_dir: expected a path"),
    ({"python": {}}, "python: expected a path"),
    ({"workdir": [1]}, "workdir: expected a path"),
    ({"env": {"A": "x\u0000y"}}, "env.A: contains a NUL byte"),
    ({"env": {f"V{i}": "1" for i in range(10_000)}}, "env: 10000 variables"),
    ({"args": ["ok", 3]}, "args[1]: expected a string"),
    ({"nodes": "2"}, "nodes: expected a whole number"),
    ({"nodes": True}, "nodes: expected a whole number"),
    ({"default_alerts": "yes"}, "default_alerts: expected true or false"),
    ({"source": {"kind": {"nested": 1}}}, "source.kind: expected a string, number"),
    ({"source": {"lines": [1, [[2]]]}}, "source.lines[1][0]: expected a string, number"),
    ({"source": {"lines": [list(range(17))]}}, "source.lines[0]: 17 items; at most 16"),
    ({"name": "job\n"}, "name: 'job\\n': use letters"),
    ({"name": "x" * (1 << 20)}, "name: is 1048576 characters long"),
    ({"args": ["a\u0000b"]}, "args[0]: contains a NUL byte"),
    ({"workdir": "/tmp/a\u0000b"}, "workdir: contains a NUL byte"),
    ({"checkpoint_dir": "relative/ckpt"}, "checkpoint_dir: 'relative/ckpt' is relative"),
    ({"workdir": "../up"}, "workdir: '../up' is relative"),
]


@pytest.mark.parametrize("extra,expected", SPEC_CASES, ids=[c[1].split(":")[0] + str(i)
                                                            for i, c in enumerate(SPEC_CASES)])
def test_spec_fields_are_typed_at_the_api(api, extra, expected):
    before = job_dirs(api), api.client.jobs()
    status, text = post(api, "/api/jobs", {"script": api.quick, **extra})
    message = one_line_error(status, text, 400, expected.split(":")[0])
    assert expected in message, message
    assert (job_dirs(api), api.client.jobs()) == before  # nothing stored, no orphan directory


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["stop_grace", "max_runtime", "progress_timeout"])
def test_non_finite_durations_are_refused(api, field, literal):
    body = f'{{"script": {json.dumps(api.quick)}, "{field}": {literal}}}'.encode()
    message = one_line_error(*raw(api, "POST", "/api/jobs", body), 400, field)
    assert "finite" in message or "at most" in message, message


def test_code_that_is_not_text_leaves_no_job_directory(api):
    before = job_dirs(api)
    message = one_line_error(*post(api, "/api/jobs", {"code": 123}), 400, "code")
    assert "expected a string" in message
    assert job_dirs(api) == before


def test_a_huge_name_is_not_echoed_back(api):
    status, text = post(api, "/api/jobs", {"script": api.quick, "name": "n" * (1 << 20)})
    assert status == 400 and len(text) < 400, len(text)


@pytest.mark.parametrize("path", ["/api/jobs", "/api/jobs/{id}/stop", "/api/jobs/{id}/resume",
                                  "/api/jobs/{id}/clone", "/api/jobs/{id}/report"])
def test_deeply_nested_json_is_a_400_on_every_post_route(api, path):
    body = b"[" * 100_000 + b"]" * 100_000
    status, text = raw(api, "POST", path.format(id=api.job["id"]), body)
    assert status in (400, 413), (status, text[:200])
    assert "body" in json.loads(text)["error"]
    status, text = raw(api, "POST", path.format(id=api.job["id"]), b'{"a":' * 5000 + b"1" + b"}" * 5000)
    assert status == 400, (status, text[:200])


@pytest.mark.parametrize("query,field", [
    ("since=" + str(10**30), "since"), ("since=-1", "since"), ("since=1e3", "since"),
])
@pytest.mark.parametrize("route", ["metrics", "events"])
def test_query_numbers_are_bounded(api, route, query, field):
    one_line_error(*raw(api, "GET", f"/api/jobs/{api.job['id']}/{route}?{query}"), 400, field)


def _cursor(data) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


@pytest.mark.parametrize("cursor", [
    "not base64 !", base64.urlsafe_b64encode(b"\xff\xfe").decode(), _cursor([1, 2]),
    _cursor({"offsets": {"0": "x"}}), _cursor({"offsets": {"0": -5}}),
    _cursor({"offsets": {"0": 10**30}}), _cursor({"offsets": {"99": 1}}),
    _cursor({"attempt": "1"}), _cursor({"offsets": []}),
    base64.urlsafe_b64encode(b"[" * 50_000).decode()[:4000],
])
def test_crafted_log_cursors_are_a_400(api, cursor):
    status, text = raw(api, "GET", f"/api/jobs/{api.job['id']}/logs?cursor={quote(cursor)}")
    one_line_error(status, text, 400, "cursor")


def test_a_rank_outside_the_world_is_named(api):
    message = one_line_error(*raw(api, "GET", f"/api/jobs/{api.job['id']}/logs?rank=9"), 400, "rank")
    assert "rank 9 does not exist in a world of 4" in message
    assert api.client.logs(api.job["id"], rank=3)["lines"]  # rank 3 does


@pytest.mark.parametrize("body,field", [
    ({"grace": -1}, "grace"), ({"grace": "5"}, "grace"), ({"grace": True}, "grace"),
    ({"grace": 10**400}, "grace"), ({"force": 1}, "force"),
])
def test_stop_bodies_are_typed(api, body, field):
    # The job has ended; a bad body is refused before the state is even looked at.
    one_line_error(*post(api, f"/api/jobs/{api.job['id']}/stop", body), 400, field)


def test_stop_grace_nan_is_refused(api):
    one_line_error(*raw(api, "POST", f"/api/jobs/{api.job['id']}/stop", b'{"grace": NaN}'),
                   400, "grace")


@pytest.mark.parametrize("body,field", [
    ({"step": "3"}, "step"), ({"step": {}}, "step"), ({"step": 2**100}, "step"),
    ({"step": 3.5}, "step"), ({"step": -1}, "step"), ({"from": 1}, "from"),
])
def test_resume_bodies_are_typed(api, body, field):
    one_line_error(*post(api, f"/api/jobs/{api.job['id']}/resume", body), 400, field)


REPORT_CASES = [
    ({"rank": "0"}, "rank"), ({"rank": -1}, "rank"), ({"rank": None}, "rank"),
    ({"metrics": {}}, "metrics"), ({"metrics": [1]}, "metrics[0]"),
    ({"metrics": [{"step": {}}]}, "metrics[0].step"),
    ({"metrics": [{"step": 2**100}]}, "metrics[0].step"),
    ({"metrics": [{"step": "<img src=x onerror=alert(1)>"}]}, "metrics[0].step"),
    ({"metrics": [{"step": 1, "values": {"loss": "high"}}]}, "metrics[0].values.loss"),
    ({"metrics": [{"step": 1, "values": []}]}, "metrics[0].values"),
    ({"metrics": [{"t": "now"}]}, "metrics[0].t"),
    ({"system": [{"device": 3}]}, "system[0].device"),
    ({"events": [1]}, "events[0]"), ({"events": "checkpoint"}, "events"),
    ({"events": [{}]}, "events[0].type"), ({"events": [{"type": 3}]}, "events[0].type"),
    ({"events": [{"type": "checkpoint", "step": "5"}]}, "events[0].step"),
    ({"events": [{"type": "x", "extra": {"deep": 1}}]}, "events[0].extra"),
    ({"attempt": 0}, "attempt"), ({"attempt": "2"}, "attempt"), ({"pid": "7"}, "pid"),
    ({"t": [1]}, "t"), ({"node": {}}, "node"),
]


@pytest.mark.parametrize("body,field", REPORT_CASES, ids=[c[1] + str(i) for i, c in
                                                          enumerate(REPORT_CASES)])
def test_malformed_reports_are_a_400_naming_the_field(api, body, field):
    before = api.client.events(api.job["id"])
    one_line_error(*post(api, f"/api/jobs/{api.job['id']}/report", body), 400, field)
    assert api.client.events(api.job["id"]) == before


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_non_finite_report_times_and_values_are_refused(api, literal):
    path = f"/api/jobs/{api.job['id']}/report"
    one_line_error(*raw(api, "POST", path, f'{{"t": {literal}}}'.encode()), 400, "t")
    one_line_error(*raw(api, "POST", path, f'{{"metrics": [{{"step": 1, "values": {{"loss": {literal}}}}}]}}'
                        .encode()), 400, "metrics[0].values.loss")


def test_a_well_formed_report_is_still_accepted(api):
    """The checks refuse only what is malformed: a batch as the runtime sends it is stored."""
    body = {"rank": 0, "node": 0, "attempt": api.job["attempt"], "pid": os.getpid(),
            "t": time.time(), "metrics": [{"t": time.time(), "step": 7, "values": {"loss": 0.5}}],
            "system": [{"t": time.time(), "device": "cpu", "values": {"cpu_util": 0.1}}],
            "events": [{"t": time.time(), "type": "nan", "step": 7, "name": "loss"}]}
    status, text = post(api, f"/api/jobs/{api.job['id']}/report", body)
    assert status == 200, text
    assert any(e["type"] == "nan" for e in api.client.events(api.job["id"]))


def test_a_9mb_report_is_413_and_healthz_does_not_wait(api):
    """The cap is checked from Content-Length before the body is read; /healthz answers while
    the oversized body is still being sent."""
    host, port = api.client.url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    size = 9 << 20
    sock.sendall((f"POST /api/jobs/{api.job['id']}/report HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: token {api.client.token}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {size}\r\n\r\n").encode())
    answer = sock.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert api.client.alive()
    sock.close()
    # The submit route has its own, larger cap; a report gets the report cap.
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall((f"POST /api/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: token {api.client.token}"
                  f"\r\nContent-Length: {64 << 20}\r\n\r\n").encode())
    assert sock.recv(4096).decode(errors="replace").startswith("HTTP/1.1 413")
    sock.close()


def test_health_answers_while_reports_stream_in(api):
    """Many maximal reports at once: /healthz keeps answering between them."""
    body = json.dumps({"rank": 0, "metrics": [{"t": time.time(), "step": i, "values": {"loss": 1.0}}
                                              for i in range(4000)]}).encode()
    done = []

    def send():
        done.append(raw(api, "POST", f"/api/jobs/{api.job['id']}/report", body)[0])

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert api.client.alive()
    for thread in threads:
        thread.join()
    assert done == [200] * 4


def test_relative_paths_are_resolved_by_the_client(api, tmp_path, monkeypatch):
    """The client resolves against the caller's directory; the launcher stores absolute paths."""
    monkeypatch.chdir(tmp_path)
    job = api.client.submit({"script": os.path.relpath(api.quick, tmp_path),
                             "checkpoint_dir": "ckpt/../ckpts", "workdir": "."})
    spec = api.client.job(job["id"])["spec"]
    assert spec["checkpoint_dir"] == str(tmp_path / "ckpts")
    assert spec["workdir"] == str(tmp_path) and spec["script"] == api.quick
    wait_for(lambda: api.client.job(job["id"])["state"] in ("SUCCEEDED", "FAILED"), 120,
             what="the job to end")


def test_every_spec_field_has_exactly_one_rule():
    """A JobSpec field without a row in SPEC_FIELDS would be refused as unknown (and one with a
    row but no field would never be set): adding a field is one row and one attribute."""
    import dataclasses

    from jupyter_dlc.spec import SPEC_FIELDS, JobSpec

    assert list(SPEC_FIELDS) == [f.name for f in dataclasses.fields(JobSpec)]


def test_cli_and_magic_options_resolve_relative_paths(tmp_path, monkeypatch):
    """`jupyter-dlc run` and `%%dlc` build specs with spec_from_options: relative paths are
    made absolute against the directory the user is in."""
    from jupyter_dlc.cli import _parser
    from jupyter_dlc.spec import spec_from_options

    monkeypatch.chdir(tmp_path)
    options, _ = _parser().parse_known_args(["run", "train.py", "--checkpoint-dir", "../ck",
                                             "--workdir", "work"])
    spec = spec_from_options(options, script="train.py")
    assert spec.checkpoint_dir == str(tmp_path.parent / "ck")
    assert spec.workdir == str(tmp_path / "work") and spec.script == str(tmp_path / "train.py")


@pytest.mark.parametrize("method,suffix", [("GET", ""), ("POST", "/report"), ("GET", "/logs")])
def test_a_long_job_ref_is_not_echoed_back(api, method, suffix):
    status, text = raw(api, method, f"/api/jobs/{'x' * 20000}{suffix}", b"{}" if method == "POST" else None)
    one_line_error(status, text, 404, "job")


# -- text that is not valid Unicode, and numbers out of range (issue 26, items 9 and 10) ----
# JSON can carry a lone UTF-16 surrogate ("\ud800"); no file name, argv, environ or SQLite
# TEXT can: it answered 500 (code) or was taken and broke later (env, args: PREFLIGHT forever).

SURROGATE = "lone UTF-16 surrogate"
SURROGATE_SPECS = [
    # (the spec, the field the error must start with)
    ({"code": "print(1)  # \ud800"}, "code"),
    ({"env": {"A": "\ud800"}}, "env.A"),
    ({"env": {"\ud800": "x"}}, "env: name"),
    ({"env": ["A=x\udfff"]}, "env[0]"),
    ({"args": ["--lr", "\udfff"]}, "args[1]"),
    ({"name": "job\ud800"}, "name"),
    ({"script": "/tmp/train\ud800.py"}, "script"),
    ({"workdir": "/tmp/\udcff"}, "workdir"),
    ({"checkpoint_dir": "/tmp/ckpt\ud800"}, "checkpoint_dir"),
    ({"python": "/usr/bin/python3\ud800"}, "python"),
    ({"alerts": ["loss > 1 -> stop \ud800"]}, "alerts[0]"),
    ({"files": {"\ud800": "/tmp/x"}}, "files: name"),
    ({"source": {"kind": "cli", "path": "/tmp/\ud800"}}, "source.path"),
    ({"cluster": "\ud800"}, "cluster"),
    ({"resources": {"\ud800": 1}}, "resources: name"),
]


@pytest.mark.parametrize("extra,field", SURROGATE_SPECS, ids=[c[1] for c in SURROGATE_SPECS])
def test_a_lone_surrogate_in_a_spec_is_a_400_naming_the_field(api, extra, field):
    from jupyter_dlc.client import LauncherClient
    from jupyter_dlc.spec import SpecError

    spec = extra if "code" in extra or "script" in extra else {"script": api.quick, **extra}
    before = job_dirs(api), api.client.jobs()
    message = one_line_error(*post(api, "/api/jobs", spec), 400, field)
    assert SURROGATE in message and "\\u" in message, message  # shown escaped, as text
    assert (job_dirs(api), api.client.jobs()) == before
    # The client says the same before the POST (the CLI and %%dlc build specs with it).
    with pytest.raises(SpecError, match=SURROGATE):
        LauncherClient.submit(api.client, spec)


def test_the_cli_refuses_text_that_is_not_unicode_before_the_post(api):
    """Bytes that are not UTF-8 on the command line (a file name's, a pasted value's) reach
    Python as lone surrogates (surrogateescape): `jupyter-dlc run` names the field and
    submits nothing."""
    before = api.client.jobs()
    result = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", "run", api.quick,
                             "--env", b"A=\xff", "--", b"--lr=\xfe"],
                            capture_output=True, timeout=120)
    error = result.stderr.decode(errors="replace")
    assert result.returncode == 2, (result.returncode, error[-500:])
    assert "env.A: holds '\\udcff' at character 0, a lone UTF-16 surrogate" in error, error
    assert api.client.jobs() == before


def test_surrogate_bytes_in_a_body_are_a_400(api):
    """UTF-8-encoded surrogates (CESU-8) are no UTF-8 either; json's reader took them."""
    before = job_dirs(api)
    body = b'{"code": "print(1)  # \xed\xa0\x80"}'
    message = one_line_error(*raw(api, "POST", "/api/jobs", body), 400, "code")
    assert SURROGATE in message
    assert job_dirs(api) == before


@pytest.mark.parametrize("path,body,field", [
    ("/api/jobs/{id}/stop", {"grace": 1, "\ud800": 1}, "body: name"),
    ("/api/jobs/{id}/resume", {"step": None, "\udfff": 1}, "body: name"),
    ("/api/jobs/{id}/clone", {"x\ud800": 1}, "body: name"),
    ("/api/pools", {"nodes": 1, "nproc_per_node": 1, "cluster": "\ud800"}, "cluster"),
    ("/api/pools/down", {"cluster": "a\ud800"}, "cluster"),
    ("/api/jobs/{id}/report", {"rank": 0, "events": [{"type": "x", "note": "\ud800"}]},
     "events[0].note"),
    ("/api/jobs/{id}/report", {"rank": 0, "system": [{"device": "gpu\ud800", "values": {}}]},
     "system[0].device"),
], ids=["stop", "resume", "clone", "pool-up", "pool-down", "report-event", "report-device"])
def test_a_lone_surrogate_is_a_400_in_every_post_body(api, path, body, field):
    before = api.client.events(api.job["id"]), api.client.pools()
    message = one_line_error(*post(api, path.format(id=api.job["id"]), body), 400, field)
    assert SURROGATE in message, message
    assert (api.client.events(api.job["id"]), api.client.pools()) == before


def _stored(api) -> tuple:
    """What a refused report must leave as it was: the job's points, events and ranks."""
    job = api.client.job(api.job["id"])
    return (api.client.metrics(api.job["id"])["last_seq"], api.client.events(api.job["id"]),
            job["last_step"], [(r["rank"], r["last_step"]) for r in job["ranks"]])


def _entry(step=1, **values):
    return {"t": time.time(), "step": step, "values": values or {"loss": 0.5}}


BIG = 10**400  # json writes it as digits: no double holds it (it was stored as null)
BAD_REPORTS = [
    # (the body, what the error must start with, what it must say)
    ({"rank": 0, "metrics": [_entry(**{"\ud800": 1.0})]}, "metrics[0].values: name", SURROGATE),
    ({"node": 0, "ranks": [{"rank": 0, "metrics": [_entry()]},
                           {"rank": 1, "metrics": [_entry(**{"loss\udfff": 1.0})]}]},
     "ranks[1].metrics[0].values: name", SURROGATE),
    ({"rank": 1000000}, "rank: rank 1000000 does not exist in a world of 4", "ranks 0-3"),
    ({"rank": 4, "metrics": [_entry()]}, "rank: rank 4 does not exist", "world of 4"),
    ({"node": 0, "ranks": [{"rank": 0, "metrics": [_entry()]}, {"rank": 1000000}]},
     "ranks[1].rank: rank 1000000 does not exist", "world of 4"),
    ({"rank": 0, "metrics": [_entry(step=2**63 - 1)]}, "metrics[0].step", "9007199254740992"),
    ({"rank": 0, "metrics": [_entry(step=2**53 + 1)]}, "metrics[0].step", "out of range"),
    ({"rank": 0, "metrics": [_entry(loss=BIG)]}, "metrics[0].values.loss", "finite number"),
    ({"rank": 0, "metrics": [_entry(loss=0.5, acc=-BIG)]}, "metrics[0].values.acc", "finite number"),
    ({"node": 0, "ranks": [{"rank": 0, "metrics": [_entry()]},
                           {"rank": 2, "metrics": [_entry(loss=BIG)]}]},
     "ranks[1].metrics[0].values.loss", "finite number"),
    ({"rank": 0, "system": [{"t": time.time(), "device": "cpu", "values": {"cpu_util": BIG}}]},
     "system[0].values.cpu_util", "finite number"),
    ({"rank": 0, "events": [{"type": "checkpoint", "step": 3, "seconds": BIG}]},
     "events[0].seconds", "finite number"),
    ({"rank": 0, "events": [{"type": "nan", "step": 2**63 - 1}]}, "events[0].step", "out of range"),
]


@pytest.mark.parametrize("body,start,says", BAD_REPORTS,
                         ids=[f"{c[1].split(':')[0]}-{i}" for i, c in enumerate(BAD_REPORTS)])
def test_reports_out_of_text_or_range_are_a_400_and_store_nothing(api, body, start, says):
    """Checked in the ingest worker where every report is; one bad entry refuses the batch."""
    before = _stored(api)
    message = one_line_error(*post(api, f"/api/jobs/{api.job['id']}/report", body), 400,
                             start.split(":")[0])
    assert message.startswith(start) and says in message, message
    assert len(message) < 300, message  # 10**400 is not echoed back whole
    assert _stored(api) == before


def test_a_request_line_over_64kb_is_answered(api):
    """Past tornado's 64 KiB of request line and headers the connection was closed without an
    answer: a long but legal query is answered now, and one past the limit is a 414."""
    status, text = raw(api, "GET", f"/api/jobs/{api.job['id']}/metrics?since=0&pad={'x' * (70 << 10)}")
    assert status == 200 and "last_seq" in json.loads(text), (status, text[:200])
    from jupyter_dlc.launcher.app import REQUEST_LINE_LIMIT

    status, text = raw(api, "GET", f"/api/jobs/{api.job['id']}/events?pad={'x' * REQUEST_LINE_LIMIT}")
    message = one_line_error(status, text, 414, "query")
    assert str(REQUEST_LINE_LIMIT) in message
    wait_for(api.client.alive, 30, what="the launcher serving on")  # /healthz waits 2 s at most


def test_a_token_that_is_not_ascii_is_a_401(api):
    """compare_digest refuses str with non-ASCII characters: that was a 500 on every route."""
    for path in ("/api/jobs", f"/api/jobs/{api.job['id']}/report"):
        status, text = raw(api, "POST" if path.endswith("report") else "GET", path,
                           b"{}" if path.endswith("report") else None,
                           headers={"Authorization": "token t\u00e9"})
        one_line_error(status, text, 401, "token")
    status, text = raw(api, "GET", "/api/jobs?token=%C3%A9", headers={"Authorization": ""})
    one_line_error(status, text, 401, "token")


def test_a_job_runs_and_keeps_its_points_after_refused_input(api):
    """After every refusal above: what was stored is all there, and a new job that logs
    (through its node reporter's batches, with a name that is not ASCII) runs and is stored."""
    good = {"rank": 0, "metrics": [_entry(step=5, **{"loss": 0.25, "d\u00e9bit": 2.0})]}
    status, text = post(api, f"/api/jobs/{api.job['id']}/report", good)
    assert status == 200, text
    # A report is answered once queued; the ingest worker stores it a moment later.
    wanted = {("loss", 5), ("d\u00e9bit", 5)}
    wait_for(lambda: wanted <= {(p["name"], p["step"])
                                for p in api.client.metrics(api.job["id"])["points"]},
             30, what="the good report stored")
    kept = api.client.metrics(api.job["id"])
    for body, _start, _says in BAD_REPORTS:
        assert post(api, f"/api/jobs/{api.job['id']}/report", body)[0] == 400
    assert api.client.metrics(api.job["id"]) == kept

    script = api.script("logs.py", """
        from jupyter_dlc import runtime
        runtime.init()
        for step in range(1, 4):
            runtime.log(step, loss=1.0 / step, d\u00e9bit=float(step))
    """)
    job = api.client.wait(api.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                             "max_restarts": 0})["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    points = api.client.metrics(job["id"])["points"]
    assert {(p["rank"], p["name"], p["step"]) for p in points} >= {
        (rank, name, step) for rank in (0, 1) for name in ("loss", "d\u00e9bit") for step in (1, 2, 3)}
    assert job["last_step"] == 3
