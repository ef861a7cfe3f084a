"""A bounded fuzz of the launcher's HTTP API with schemathesis, against the OpenAPI document
the launcher serves: about 1,500 requests, and not one may answer 5xx (issue 12).

A real launcher on loopback, with one real ended job so that the job routes reach their
handlers. Choices that keep the fuzz from starting real jobs (which would pile up processes):
- submit, resume and clone get NEGATIVE cases only (bodies the schema forbids), so each must be
  refused with a 4xx before anything starts; their success paths are covered by the job tests;
- their path parameter is the real job, so that the refusal comes from the body checks and not
  from a 404 (a random id can prefix-match a job, so it is not used for them);
- DELETE gets random job ids only, and runs last (a random id may still match the job);
- the event stream never ends by design and is left out.
The test then asserts that no job was added and no job process runs.
"""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from jupyter_dlc import openapi

EXAMPLES = 55  # per operation, mode and job choice: about 1,500 requests in all
NEGATIVE_ONLY = {"submitJob", "resumeJob", "cloneJob"}
RANDOM_JOB_ONLY = {"deleteJob"}
LEFT_OUT = {"stream", "jobMetricsStream"}


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


def fuzzer(op, mode, path, url, session, auth, sent, failures):
    """A hypothesis test of EXAMPLES cases for one operation; records statuses and 5xx."""

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode, path_parameters=path))
    def run(case):
        response = case.call(base_url=url, session=session, headers=auth, timeout=30)
        sent.append(response.status_code)
        accepted = response.status_code < 400 and op.definition.raw.get("operationId") in NEGATIVE_ONLY
        if response.status_code >= 500 or accepted:
            failures.append(f"{op.method.upper()} {op.path} ({mode.value}): "
                            f"{response.status_code} for {case.as_curl_command()[:300]}")

    return run


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
