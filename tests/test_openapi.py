"""The wire contract: the served OpenAPI document covers every route, real answers of a real
launcher (after a real job that succeeded and one that failed) validate against it, and the
panel's contract fixtures (labextension/test/fixtures/launcher.json) are those real answers.

To refresh the fixtures after a deliberate change of the wire format:
    DLC_UPDATE_FIXTURES=1 .venv/bin/python -m pytest tests/test_openapi.py -k fixtures
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import pytest
import tornado.web
from conftest import wait_for
from jsonschema import Draft202012Validator

from jupyter_dlc.launcher import openapi
from jupyter_dlc.client import LauncherError
from jupyter_dlc.launcher.app import make_app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "labextension", "test", "fixtures", "launcher.json")

GOOD = """
import torch
from jupyter_dlc import runtime
runtime.init()
model = torch.nn.Linear(4, 1)
ckpt = runtime.Checkpointer(model=model)
step = ckpt.restore()
while step < 6:
    step += 1
    # the step breakdown (issue 23's names), logged by hand: `why` then has a verdict
    runtime.log(step, loss=1.0 / step, step_ms=10.0, data_wait_ms=1.0, grad_sync_ms=1.0,
                ckpt_stall_ms=0.0)
    if step == 4:
        ckpt.save(step)
print("done at step", step, flush=True)
"""

BAD = """
import os
from jupyter_dlc import runtime
runtime.init()
runtime.log(1, loss=0.5)
if os.environ["RANK"] == "1":
    raise ValueError("the learning rate must be positive")
"""

# Nine ranks, past the 8 a chart draws one line each for: a view reads its train points as
# bands (jupyter_dlc/bands.py). Rank 8's loss stands out.
WIDE = """
import os
from jupyter_dlc import runtime
runtime.init()
for step in (1, 2):
    runtime.log(step, loss=(100.0 if os.environ["RANK"] == "8" else 1.0) + int(os.environ["RANK"]) * 1e-3)
"""


def validator(name: str, doc: dict) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", **doc})


@pytest.fixture(scope="module")
def contract(shared_launcher):
    """A succeeded and a failed real job, and the served document."""
    client = shared_launcher.client
    client.pool_up(1, 1)  # a warm pool, for the Pools payload (released with the launcher)
    good = client.submit({"script": shared_launcher.script("good.py", GOOD), "nodes": 1,
                          "nproc_per_node": 2, "max_restarts": 0})
    bad = client.submit({"script": shared_launcher.script("bad.py", BAD), "nodes": 1,
                         "nproc_per_node": 2, "max_restarts": 0})
    # Its entries hold the loss alone (no step breakdown): the panel's band tests count them.
    wide = client.submit({"script": shared_launcher.script("wide.py", WIDE), "nodes": 1,
                          "nproc_per_node": 9, "max_restarts": 0,
                          "env": {"DLC_STEP_BREAKDOWN": "0"}})
    good = client.wait(good["id"], timeout=180)
    bad = client.wait(bad["id"], timeout=180)
    wide = client.wait(wide["id"], timeout=180)
    assert good["state"] == "SUCCEEDED", good["reason"]
    assert bad["state"] == "FAILED", bad["reason"]
    assert wide["state"] == "SUCCEEDED", wide["reason"]
    doc = client.request("GET", "/api/openapi.json")[1]
    return shared_launcher, good["id"], bad["id"], doc, wide["id"]


def _template(pattern: str) -> list[str]:
    """The document's path templates a tornado route pattern stands for."""
    pattern = pattern.rstrip("$").replace("/api/pools/([^/]+)", "/api/pools/{pool}")
    pattern = pattern.replace("([^/]+)", "{job}").replace("\\.", ".")
    match = re.search(r"\(([a-z|]+)\)", pattern)
    if match:
        return [pattern.replace(match.group(0), word) for word in match.group(1).split("|")]
    return [pattern]


def test_every_tornado_route_is_in_the_document():
    app = make_app(launcher=None)
    doc = openapi.document()
    served = []
    for rule in app.wildcard_router.rules:
        pattern = rule.matcher.regex.pattern
        if pattern.rstrip("$") == "/.*":
            continue  # the 404 catch-all
        methods = {m for m in ("get", "post", "delete")
                   if getattr(rule.target, m) is not getattr(tornado.web.RequestHandler, m)}
        for path in _template(pattern):
            served.append(path)
            assert path in doc["paths"], f"{path} is served but not in the OpenAPI document"
            documented = set(doc["paths"][path]) - {"parameters"}
            assert documented == methods, (path, documented, methods)
    assert sorted(served) == sorted(doc["paths"]), "the document lists a route nobody serves"


def test_the_document_is_valid_and_its_states_are_the_enum():
    from jupyter_dlc.states import ALL_STATES

    doc = openapi.document()
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    assert doc["components"]["schemas"]["JobState"]["enum"] == list(ALL_STATES)


def test_the_document_is_served_with_the_token_only(shared_launcher):
    client = shared_launcher.client
    assert client.request("GET", "/api/openapi.json")[1] == json.loads(
        json.dumps(openapi.document()))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(client.url + "/api/openapi.json", timeout=5)
    assert refused.value.code == 401


def real_payloads(contract) -> dict[str, tuple[str, object]]:
    """name → (schema, payload) from the real launcher: what the panel and clients parse."""
    launcher, good, bad, _, wide = contract
    c = launcher.client
    stream = c.stream(timeout=30)
    event, summary = next(stream)
    stream.close()
    assert event == "job"
    logs = c.logs(good, tail=5)
    return {
        "jobs": ("JobList", {"jobs": c.jobs()}),
        "job_succeeded": ("JobDetail", c.job(good)),
        "job_failed": ("JobDetail", c.job(bad)),
        "stream_job": ("JobSummary", summary),
        "diagnosis_failed": ("Diagnoses", c.why(bad)),
        "diagnosis_succeeded": ("Diagnoses", c.why(good)),
        "evidence": ("Evidence", {"evidence": c.evidence(bad)}),
        "goodput": ("Goodput", c.goodput(good)),
        "checkpoints": ("Checkpoints", {"checkpoints": c.checkpoints(good)}),
        "logs": ("Logs", logs),
        "metrics": ("Metrics", c.metrics(good)),
        "metrics_stream": ("Metrics", next(d for e, d in c.metrics_stream(good) if e == "metrics")),
        "job_rank_page": ("JobDetail", c.job(wide, rank_sort="step", rank_page=1, rank_page_size=4)),
        "metrics_band": ("Metrics", c.metrics(wide, band=())),
        "metrics_band_stream": ("Metrics", next(d for e, d in c.metrics_stream(wide, band=[8])
                                                if e == "metrics")),
        "events": ("Events", {"events": c.events(good)}),
        "alerts": ("Alerts", c.alerts(good)),
        "script": ("Script", c.script(good)),
        "health": ("Health", c.request("GET", "/healthz")[1]),
        "pools": ("Pools", {"pools": wait_for(lambda: [p for p in c.pools() if p["state"] == "ready"],
                                              120, what="pool ready")}),
        "error": ("Error", {"error": _error(c, f"/api/jobs/{good}/logs", {"rank": 9})}),
    }


def _error(client, path, params) -> str:
    with pytest.raises(LauncherError) as refused:
        client.request("GET", path, params=params)
    return str(refused.value)


def test_real_responses_validate_against_the_document(contract):
    doc = contract[3]
    payloads = real_payloads(contract)
    assert payloads["diagnosis_failed"][1]["diagnoses"], "the failed job has no diagnosis"
    assert payloads["diagnosis_succeeded"][1]["verdict"]["verdict"] == "healthy"
    assert payloads["evidence"][1]["evidence"], "the failed attempt kept no evidence"
    assert payloads["checkpoints"][1]["checkpoints"], "the good job committed no checkpoint"
    band = payloads["metrics_band"][1]
    assert [(row["step"], row["n"], row["outliers"][0]["rank"]) for row in band["bands"]
            if row["name"] == "loss"] == [(1, 9, 8), (2, 9, 8)]
    assert not [p for p in band["points"] if p["kind"] == "train"]
    paged = payloads["job_rank_page"][1]
    assert [r["rank"] for r in paged["ranks"]] == [4, 5, 6, 7]
    assert {k: paged["rank_page"][k] for k in ("page", "pages", "total")} == {"page": 1, "pages": 3, "total": 9}
    c = contract[0].client
    assert _error(c, f"/api/jobs/{contract[4]}", {"rank_sort": "speed"}).startswith(
        "rank_sort: expected one of rank, step, heartbeat")
    assert _error(c, f"/api/jobs/{contract[4]}/metrics", {"band": 1, "ranks": "1,x"}).startswith("ranks: ")
    kept = payloads["metrics_band_stream"][1]
    assert {p["rank"] for p in kept["points"] if p["kind"] == "train"} == {8}
    assert [row["n"] for row in kept["bands"] if row["name"] == "loss"] == [8, 8]
    for name, (schema, payload) in payloads.items():
        errors = sorted(validator(schema, doc).iter_errors(payload), key=str)
        assert not errors, f"{name}: {errors[0].message} at {list(errors[0].absolute_path)}"


FREE_FORM = {"data", "commands"}  # an event's own fields, a command: not part of the shape


def _shape(value, key: str = ""):
    """The field names of a payload, recursively; not the values (ids, times, pids), which
    differ from run to run. A list's shape is the union of its items' shapes."""
    if key in FREE_FORM:
        return "free"
    if isinstance(value, dict):
        return {k: _shape(item, k) for k, item in sorted(value.items())}
    if isinstance(value, list):
        merged: dict = {}
        for item in value:
            shape = _shape(item, key)
            if not isinstance(shape, dict):
                return ["leaf"]
            for k, sub in shape.items():
                merged[k] = sub if merged.get(k) in (None, "leaf") else merged[k]
        return [merged] if value else []
    return "leaf"


def test_panel_fixtures_are_real_launcher_payloads(contract):
    """The jest contract test (labextension/test/contract.test.ts) reads these payloads."""
    fresh = {name: payload for name, (_, payload) in real_payloads(contract).items()}
    if os.environ.get("DLC_UPDATE_FIXTURES") == "1" or not os.path.exists(FIXTURES):
        os.makedirs(os.path.dirname(FIXTURES), exist_ok=True)
        with open(FIXTURES, "w") as f:
            json.dump(fresh, f, indent=1, sort_keys=True)
            f.write("\n")
        if os.environ.get("DLC_UPDATE_FIXTURES") != "1":
            pytest.fail(f"{FIXTURES} was missing; written now: commit it")
    with open(FIXTURES) as f:
        committed = json.load(f)
    for name, payload in fresh.items():
        assert name in committed, f"fixture {name} is missing; rerun with DLC_UPDATE_FIXTURES=1"
        assert _shape(committed[name]) == _shape(payload), (
            f"the launcher's {name} payload changed shape; rerun with DLC_UPDATE_FIXTURES=1 and "
            "check the panel's parsers against it")


LAB = os.path.join(ROOT, "labextension")


def test_the_committed_document_is_current():
    """labextension/openapi.json (what the panel's types are generated from) is the document."""
    with open(os.path.join(LAB, "openapi.json")) as f:
        committed = f.read()
    assert committed == json.dumps(openapi.document(), indent=1, sort_keys=True) + "\n", (
        "labextension/openapi.json is stale: run `npm run wire` in labextension and commit")


def test_the_panel_types_are_generated_from_the_document():
    """src/wire.ts is exactly what openapi-typescript makes of the document (`npm run wire`)."""
    import subprocess

    tool = os.path.join(LAB, "node_modules", ".bin", "openapi-typescript")
    assert os.path.exists(tool), "run `npm ci` in labextension (scripts/setup.sh does)"
    fresh = subprocess.run([tool, "openapi.json", "--enum-values"], cwd=LAB, capture_output=True,
                           text=True, timeout=120, check=True).stdout
    with open(os.path.join(LAB, "src", "wire.ts")) as f:
        assert f.read() == fresh, "labextension/src/wire.ts is stale: run `npm run wire` and commit"
