"""A bounded fuzz of the launcher's HTTP API with schemathesis, against the OpenAPI document
the launcher serves: about 1,500 requests, and not one may answer 5xx (issue 12).

A real launcher on loopback, with one real ended job so that the job routes reach their
handlers. Choices that keep the fuzz from starting real jobs (which would pile up processes):
- submit, resume and clone get NEGATIVE cases only (bodies the schema forbids), so each must be
  refused with a 4xx before anything starts; their success paths are covered by the job tests;
- their path parameter is the real job, so that the refusal comes from the body checks and not
  from a 404 (a random id can prefix-match a job, so it is not used for them);
- DELETE gets random job ids only, and runs last (a random id may still match the job);
- the event stream never ends by design and is left out;
- what the schemas cannot say (issue 26): every POST body and every integer query argument
  also gets BOUNDARY cases, valid cases with one part made invalid (a lone UTF-16 surrogate in
  a string or a name, a number past a double's range, a step past 2^53, a rank outside the
  job's world); each must be refused with a 4xx.
The test then asserts that no job was added and no job process runs.
"""

from __future__ import annotations

import copy
import json
import time
from urllib.parse import quote

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from jupyter_dlc.launcher import openapi

EXAMPLES = 55  # per operation, mode and job choice: about 1,500 requests in all
NEGATIVE_ONLY = {"submitJob", "resumeJob", "cloneJob"}
RANDOM_JOB_ONLY = {"deleteJob"}
LEFT_OUT = {"stream", "jobMetricsStream"}
BOUNDARY = "boundary"  # a mode of our own: see mutate
BOUNDARY_EXAMPLES = 20  # per operation: about 220 requests
WORLD = 2  # the fuzz job's ranks (1 node x 2)
SURROGATES = ("\ud800", "\udfff", "\udc80")
HUGE = (10**400, -(10**400))


@pytest.fixture(scope="module")
def target(shared_launcher):
    script = shared_launcher.script("fuzzjob.py", "print('fuzz target')\n")
    job = shared_launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 2,
                                         "max_restarts": 0})
    shared_launcher.client.wait(job["id"], timeout=120)
    return shared_launcher, job["id"]


def plan(job_id: str):
    """(operation, mode, path parameters or None for random ones)."""
    doc = openapi.document()
    # The token goes in every request's header; left in the document, negative cases would
    # "negate" the security scheme alone and send a valid body (a real clone).
    doc.pop("security")
    doc["components"].pop("securitySchemes")
    schema = schemathesis.openapi.from_dict(doc)
    ops = [result.ok() for result in schema.get_all_operations()]
    # DELETE last: a random id can match the fixture job ("last", a prefix), and the other
    # routes should reach it first.
    for op in sorted(ops, key=lambda op: op.method == "delete"):
        op_id = op.definition.raw.get("operationId")
        if op_id in LEFT_OUT:
            continue
        modes = [GenerationMode.NEGATIVE] if op_id in NEGATIVE_ONLY else list(GenerationMode)
        has_job = "{job}" in op.path
        jobs = [None] if op_id in RANDOM_JOB_ONLY or not has_job else \
            [{"job": job_id}] if op_id in NEGATIVE_ONLY else [{"job": job_id}, None]
        for mode in modes:
            for path in jobs:
                yield op, mode, path
        if op.method == "post" or any(p.get("in") == "query" and p.get("schema", {}).get("type") == "integer"
                                      for p in op.definition.raw.get("parameters", ())):
            # On the real job, so that the refusal comes from the checks, not from a 404.
            yield op, BOUNDARY, {"job": job_id} if has_job else None


def _slots(value, parent=None, key=None):
    """(container, key, leaf) of every string and number in a body, and (dict, None, dict)
    for every object (where a name can be added)."""
    if isinstance(value, dict):
        yield value, None, value
        for name, item in value.items():
            yield from _slots(item, value, name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _slots(item, value, index)
    elif parent is not None and (isinstance(value, str) or
                                 (isinstance(value, (int, float)) and not isinstance(value, bool))):
        yield parent, key, value


def mutate(case, data, op_id: str) -> tuple:
    """(body, query, what was done): copies of a valid case's, with one part made invalid in a
    way the schemas do not say."""
    body = copy.deepcopy(case.body) if isinstance(case.body, dict) else None
    query = dict(case.query) if isinstance(case.query, dict) else {}
    if isinstance(body, dict):
        container, key, leaf = data.draw(st.sampled_from(list(_slots(body))))
        if op_id == "report" and data.draw(st.booleans()):
            entries = [item for item in body.get("ranks") or () if isinstance(item, dict)]
            target = data.draw(st.sampled_from(entries)) if entries else body
            target["rank"] = data.draw(st.integers(WORLD, 1 << 20))
            return body, query, f"rank {target['rank']}"
        if key is None:  # an object: a name that is no text
            container[data.draw(st.sampled_from(SURROGATES))] = 1
            return body, query, "surrogate name"
        if isinstance(leaf, str):
            container[key] = leaf + data.draw(st.sampled_from(SURROGATES))
            return body, query, f"surrogate in {key}"
        container[key] = data.draw(st.sampled_from(HUGE + ((2**63 - 1, 2**53 + 1) if key == "step" else ())))
        return body, query, f"{key} = {str(container[key])[:12]}..."
    ints = [p["name"] for p in case.operation.definition.raw.get("parameters", ())
            if p.get("in") == "query" and p.get("schema", {}).get("type") == "integer"]
    name = data.draw(st.sampled_from(ints))
    query[name] = str(10**6 if name == "rank" else 10**400)
    return body, query, f"query {name}"


def send(session, url, auth, case, body, query):
    """A request as schemathesis sends one, with a body it would not (its revalidation of an
    edited case cannot encode a lone surrogate): JSON with surrogates as \\u escapes."""
    path = case.operation.path.format(**{k: quote(str(v), safe="") for k, v in
                                         (case.path_parameters or {}).items()})
    data = None if body is None else json.dumps(body).encode()
    return session.request(case.method, url + path, params=query, data=data, timeout=30,
                           headers={**auth, "Content-Type": "application/json"})


def fuzzer(op, mode, path, url, session, auth, sent, failures):
    """A hypothesis test of EXAMPLES cases for one operation; records statuses and 5xx."""

    boundary = mode == BOUNDARY
    op_id = op.definition.raw.get("operationId")

    @settings(max_examples=BOUNDARY_EXAMPLES if boundary else EXAMPLES, deadline=None,
              database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE if boundary else mode,
                               path_parameters=path), data=st.data())
    def run(case, data):
        if boundary:
            body, query, what = mutate(case, data, op_id)
            response = send(session, url, auth, case, body, query)
        else:
            body, query, what = case.body, case.query, ""
            response = case.call(base_url=url, session=session, headers=auth, timeout=30)
        sent.append(response.status_code)
        accepted = response.status_code < 400 and (boundary or op_id in NEGATIVE_ONLY)
        if response.status_code >= 500 or accepted:
            failures.append(f"{op.method.upper()} {op.path} ({what or mode.value}): "
                            f"{response.status_code} {response.text[:200]} for "
                            f"{ascii(body)[:300]} {query}")

    return run


# About 2,250 requests: past 300 s on a machine shared with other runs (711 s measured).
@pytest.mark.timeout(1200)
def test_fuzz_the_api_with_no_5xx(target):
    launcher, job_id = target
    client = launcher.client
    before = [j["id"] for j in client.jobs()]
    session = requests.Session()
    auth = {"Authorization": f"token {client.token}"}
    sent, failures = [], []
    started = time.monotonic()
    for op, mode, path in plan(job_id):
        run = fuzzer(op, mode, path, client.url, session, auth, sent, failures)
        try:
            run()
        except Unsatisfiable:
            continue  # nothing negative to generate (a route with no inputs)
    took = time.monotonic() - started
    print(f"fuzz: {len(sent)} requests in {took:.0f}s, "
          f"statuses {sorted(set(sent))}")
    assert not failures, "\n".join(failures[:10])
    assert len(sent) >= 1200, len(sent)
    assert client.alive()
    assert set(j["id"] for j in client.jobs()) <= set(before), "the fuzz started a job"
    assert launcher.own_processes() == []
