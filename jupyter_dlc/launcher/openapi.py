"""The launcher's wire contract: an OpenAPI 3 document of every route, body and enum.

Served at `GET /api/openapi.json`; the panel's TypeScript types are generated from it
(labextension/src/wire.d.ts) and the API fuzz test runs against it. Request bodies come from
the same tables the launcher checks them with (spec.SPEC_FIELDS, bodies.py) and the
job states from states.JobState, so the document cannot promise what the launcher refuses.
Responses are described here; tests/test_openapi.py validates real responses against them.
Response objects list the fields clients rely on as required and allow more, so that adding a
field is not a breaking change but renaming one fails the contract tests.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from .. import __version__, bodies, clusters
from ..engines.contract import Capabilities
from ..spec import ENGINES, SPEC_FIELDS
from ..states import ACTIVE_STATES, TERMINAL_STATES, JobState
from .goodput import PARTS as _GOODPUT_PARTS
from .store import RANK_ORDERS


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None,
         description: str = "") -> dict:
    out = {"type": "object", "required": list(required),
           "properties": {**required, **(optional or {})}}
    if description:
        out["description"] = description
    return out


_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_ANY_OBJ = {"type": "object"}


def _null(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


# A loss can be "nan" or "inf" as a string: JSON has no NaN.
_LOSS = {"anyOf": [_NUM, _STR, {"type": "null"}]}

SCHEMAS: dict[str, dict] = {
    "JobState": {"type": "string", "enum": [s.value for s in JobState],
                 "description": f"Active: {', '.join(ACTIVE_STATES)}. "
                                f"Ended: {', '.join(TERMINAL_STATES)}."},
    "TerminalState": {"type": "string", "enum": list(TERMINAL_STATES),
                      "description": "The states a job ends in; only resume or clone leave them."},
    "Error": _obj({"error": _STR}, description="Every 4xx/5xx: one line, naming the field."),
    "JobSpec": {"type": "object", "additionalProperties": False,
                "description": "What to run. Exactly one of script or code. Paths are absolute.",
                "properties": {name: rule.json_schema() for name, rule in SPEC_FIELDS.items()}},
    "StopBody": bodies.STOP,
    "ResumeBody": bodies.RESUME,
    "EmptyBody": bodies.EMPTY,
    "Report": bodies.REPORT,
    "NodeLogs": bodies.NODE_LOGS,
    "Source": {"type": "object", "properties": {"kind": _null(_STR), "path": _null(_STR)},
               "description": "Where a job came from: kind notebook|cli and a path."},
    "JobSummary": _obj({
        "id": _STR, "name": _STR, "state": _ref("JobState"), "attempt": _INT,
        "created": _NUM, "started": _null(_NUM), "ended": _null(_NUM), "reason": _null(_STR),
        "last_step": _null(_INT), "last_loss": _LOSS, "nodes": _INT, "nproc_per_node": _INT,
        "engine": {"type": "string", "enum": list(ENGINES)}, "source": _ref("Source"),
        "job_dir": _STR, "stop_requested": _null(_NUM),
        "storage": {**_null(_STR), "description": "null, or the data dir's full disk in one line"}},
        {"goodput": {**_null(_NUM), "description": "productive step time over wall time since "
                     "submit (GET /api/jobs/{job}/goodput has the whole ledger); null until a "
                     "step was reported"},
         "progress": _null(_ref("Progress")),
         "parent": {**_null(_ref("Parent")), "description": "the job and step a branch "
                    "(`--from JOB@STEP`) started from; null for a job that is no branch"},
         "sweep": {**_null(_ref("SweepRef")), "description": "null for a job that is no trial"},
         "params": {"type": "object", "description": "a trial's parameters (runtime.params())"}}),
    "Parent": _obj({"job": _STR, "step": _INT}),
    "SweepRef": _obj({"id": _STR, "trial": _INT, "parallel": _null(_INT)},
                     description="The sweep a trial belongs to, its number, and how many of the "
                                 "sweep's trials run at once (null: as admission allows)."),
    "Progress": _obj({"step": _null(_INT), "total_steps": _null(_INT),
                      "steps_per_second": _null(_NUM), "eta_seconds": _null(_NUM)},
                     description="`total_steps` from the spec's `steps` or the script's "
                                 "runtime.init(total_steps=N); the rate is rank 0's over its last "
                                 "20 steps of the current attempt; `eta_seconds` is null once the "
                                 "job ended or while either is unknown."),
    "GoodputParts": _obj({part: _NUM for part in _GOODPUT_PARTS}, description=(
        "Seconds of wall time, disjoint and summing to `wall_seconds`; see "
        "jupyter_dlc/launcher/goodput.py for where each begins and ends.")),
    "Goodput": _obj({"job": _STR, "state": _ref("JobState"), "wall_seconds": _NUM,
                     "goodput": {**_null(_NUM), "description": "parts.productive / wall_seconds; "
                                 "null until a step was reported"},
                     "parts": _ref("GoodputParts"),
                     "steps_counted": {**_INT, "description": "rank 0's steps in `productive`"},
                     "breakdown_rank": {**_INT, "description": "the rank whose step times, "
                                        "data_wait_ms and ckpt_stall_ms the ledger reads"},
                     "progress": _null(_ref("Progress"))},
                    description="Where the job's wall time went, from its submit to now or to its end."),
    "Rank": _obj({"rank": _INT, "node": _null(_INT), "local_rank": _null(_INT),
                  "state": _STR, "pid": _null(_INT), "exit_code": _null(_INT),
                  "last_step": _null(_INT), "last_progress": _null(_NUM),
                  "last_heartbeat": _null(_NUM)}),
    "Diagnosis": _obj(
        {"class": _STR, "line": _null(_STR), "suggestion": _null(_STR)},
        {"rank": _null(_INT), "node": _null(_INT), "time": _null(_NUM), "exit_code": _null(_INT),
         "context": _null({"type": "array", "items": _STR}),
         "same_ranks": _null({"type": "array", "items": _INT}), "where": _null(_STR)},
        "The first error of an attempt: its class, the line, what to do."),
    "Attempt": _obj({"attempt": _INT, "state": _ref("JobState"), "started": _null(_NUM),
                     "ended": _null(_NUM), "reason": _null(_STR), "outcome": _null(_STR),
                     "resume_path": _null(_STR), "restarts": _INT,
                     "failure": _null(_ref("Diagnosis"))},
                    {"engine_id": {**_null(_STR), "description": "the engine's id (a Slurm job id)"},
                     "start": {**_null(_STR), "description": "how it started: `warm pool ID`, "
                                                             "or `cold start (why)`"},
                     "checkpoint_dir": {**_null(_STR), "description": "where the attempt's ranks "
                                        "commit checkpoints, as the launcher sees it: the engine's "
                                        "answer when the attempt started"}}),
    "Checkpoint": _obj({"step": _INT, "path": _null(_STR)},
                       {"time": _null(_NUM), "size": _null(_INT), "world_size": _null(_INT),
                        "seconds": _null(_NUM), "attempt": _null(_INT),
                        "verification": {"type": "string", "enum": ["verified", "unverified", "corrupt"],
                                         "description": "`verified`: an attempt restored it and every "
                                         "rank checked its file's sha256 against the manifest; "
                                         "`corrupt`: a rank found its file not matching (see "
                                         "`corrupt`), so no restart or resume takes it; "
                                         "`unverified`: sizes match, no file hashed since written"},
                        "corrupt": {"type": "array", "items": _ref("CorruptFile")}}),
    "CorruptFile": _obj({"file": _null(_STR), "rank": _null(_INT), "why": _null(_STR),
                         "attempt": _null(_INT)},
                        description="A file of the step that a rank found not matching its manifest."),
    "JobDetail": {"allOf": [_ref("JobSummary"), _obj({
        "spec": _ANY_OBJ, "ranks": {"type": "array", "items": _ref("Rank")},
        "attempts": {"type": "array", "items": _ref("Attempt")},
        "last_checkpoint": _null(_ref("Checkpoint")),
        "stragglers": {"type": "array", "items": _ref("Straggler"),
                       "description": "who the straggler detector names now, while the job "
                                      "runs (launcher/stragglers.py); empty once it ended"},
        "engine_report": _ref("EngineReport")},
        {"rank_page": _ref("RankPage")})]},
    "EngineReport": _obj(
        {"name": _STR,
         "capabilities": {"type": "object", "additionalProperties": False,
                          "properties": {f.name: {"type": "boolean", "description": f.metadata.get("feature", "")}
                                         for f in dataclasses.fields(Capabilities)}},
         "cannot": {"type": "array", "items": _obj(
             {"capability": _STR,
              "feature": {**_STR, "description": "the feature, in the words of ARCHITECTURE.md's "
                                                 "engine-by-feature table"}})}},
        {"error": {**_STR, "description": "why the engine could not be asked (not installed)"}},
        description="What the job's engine can and cannot do for it (contract.capability_report)"),
    "Straggler": _obj(
        {"key": {**_STR, "description": "`rank R` or `node N`"},
         "kind": {"type": "string", "enum": ["rank", "node"]}, "node": _INT,
         "ranks": {"type": "array", "items": _INT},
         "own_ms": {**_NUM, "description": "its own work a step (step_ms - grad_sync_ms), "
                                           "median of its recent steps"},
         "median_ms": {**_NUM, "description": "the median rank's own work a step"},
         "wait_ms": {**_NUM, "description": "the others' median wait in the all-reduce"},
         "data_wait_ms": _NUM, "peer_data_wait_ms": _NUM,
         "bound": {"type": "string", "enum": ["input", "compute"]}, "message": _STR},
        description="A rank whose own work stays far above its peers' while they wait for it "
                    "in the gradient sync, or a node all of whose ranks do."),
    "PerformanceVerdict": _obj(
        {"verdict": {"type": "string", "enum": ["input-bound", "communication-bound",
                                                "checkpoint-bound", "straggler", "healthy"]},
         "line": _STR, "suggestion": _STR,
         "figures": _obj({"steps": _INT, "step_ms": _NUM, "data_wait_ms": _NUM,
                          "grad_sync_ms": _NUM, "ckpt_stall_ms": _NUM, "compute_ms": _NUM,
                          "shares": {"type": "object", "additionalProperties": _NUM}}),
         "stragglers": {"type": "array", "items": _ref("Straggler")}},
        description="Where the step time of a job that did not fail goes, over each rank's "
                    "last 100 steps (launcher/performance.py)."),
    "EvidenceFile": _obj({"name": _STR, "what": _STR, "size": _INT}),
    "EvidenceFolder": _obj(
        {"attempt": _INT, "t": _NUM, "reason": _STR, "seconds": _NUM, "dir": _STR,
         "files": {"type": "array", "items": _ref("EvidenceFile")},
         "skipped": {"type": "array", "items": _STR}},
        description="What the supervisor kept of an attempt before killing it hung or failing "
                    "(launcher/evidence.py): the folder and its files; `skipped` says what was "
                    "not kept and why."),
    "Evidence": _obj({"evidence": {"type": "array", "items": _ref("EvidenceFolder")}}),
    "RankPage": _obj(
        {"sort": {"type": "string", "enum": list(RANK_ORDERS)}, "page": _INT, "size": _INT,
         "total": _INT, "pages": _INT,
         "states": {"type": "object", "additionalProperties": _INT}},
        description="With rank_sort or rank_page: `ranks` is this page of the attempt's ranks; "
                    "`states` counts them all by state."),
    "JobList": _obj({"jobs": {"type": "array", "items": _ref("JobSummary")}}),
    "LogLine": _obj({"rank": _INT, "attempt": _INT, "text": _STR}),
    "Logs": _obj({"lines": {"type": "array", "items": _ref("LogLine")}, "cursor": _STR,
                  "attempt": _INT}, description="Pass cursor back to get only new lines."),
    "MetricPoint": _obj({"seq": _INT, "t": _NUM, "kind": {"type": "string",
                                                          "enum": ["train", "system"]},
                         "name": _STR, "value": _null(_NUM), "step": _null(_INT),
                         "rank": _null(_INT)},
                        {"attempt": _null(_INT), "node": _null(_INT), "device": _null(_STR)}),
    "Downsampled": _obj(
        {"until": _NUM, "bucket_seconds": _NUM, "dropped": _INT, "keep_last": _INT},
        description="Points logged up to `until` are downsampled: of each bucket of "
                    "`bucket_seconds`, the points with its minimum, maximum, last value and "
                    "first NaN are kept; the last `keep_last` points of a series are as logged."),
    "BandOutlier": _obj({"rank": _INT, "value": _NUM}),
    "BandRow": _obj(
        {"attempt": _null(_INT), "name": _STR, "step": _INT, "t": _null(_NUM), "n": _INT,
         "sum": _NUM, "lo": _NUM, "hi": _NUM,
         "outliers": {"type": "array", "items": _ref("BandOutlier")}},
        description="The values of one train metric at one step read in this answer, over "
                    "the ranks not sent as points: count, sum, min, max, and the ranks that "
                    "stand out among them (none under 8 values). A step may come in several "
                    "rows, across answers: add them up."),
    "Metrics": _obj({"points": {"type": "array", "items": _ref("MetricPoint")},
                     "last_seq": _INT,
                     "downsampled": {**_null(_ref("Downsampled")),
                                     "description": "null while every point is as logged"},
                     "bands": {**_null({"type": "array", "items": _ref("BandRow")}),
                               "description": "with band=1 past 8 ranks: the train points "
                                              "not in `points`, folded per step; else null"}}),
    "Event": _obj({"seq": _INT, "job_id": _STR, "t": _NUM, "type": _STR,
                   "reason": _null(_STR)},
                  {"attempt": _null(_INT), "state": _null(_ref("JobState")),
                   "data": _null(_ANY_OBJ)}),
    "Events": _obj({"events": {"type": "array", "items": _ref("Event")}}),
    "Checkpoints": _obj({"checkpoints": {"type": "array", "items": _ref("Checkpoint")}}),
    "Diagnoses": _obj({"diagnoses": {"type": "array", "items": {"allOf": [
        _ref("Diagnosis"), _obj({"attempt": _INT, "reason": _null(_STR)})]}},
        "verdict": {**_null(_ref("PerformanceVerdict")),
                    "description": "for a job that did not fail: where its step time goes; null "
                                   "for a failed job or one that logged no step breakdown"}}),
    "Alert": _obj({"rule": _STR, "condition": _STR, "action": _STR, "active": {"type": "boolean"}},
                  {"since": _null(_NUM), "url": _null(_STR)}),
    "Alerts": _obj({"alerts": {"type": "array", "items": _ref("Alert")},
                    "events": {"type": "array", "items": _ref("Event")}}),
    "Script": _obj({"script": _STR, "files": {"type": "array", "items": _STR}}),
    "ReportAnswer": _obj({"ok": {"type": "boolean"}, "commands": {"type": "array"}},
                         {"stale": {"type": "boolean"},
                          "report_interval": {**_NUM, "description": (
                              "seconds the sender should leave between its requests (0: its own "
                              "pace); grows with the number of senders (launcher/pacing.py)")},
                          "rank_commands": {"type": "object", "description":
                                            "a node batch's answer: rank → its commands",
                                            "additionalProperties": {"type": "array"}}}),
    "NodeLogsAnswer": _obj({"ok": {"type": "boolean"}}, {"stale": {"type": "boolean"}}),
    "PoolUpBody": bodies.POOL_UP,
    "PoolDownBody": bodies.POOL_DOWN,
    "Pool": _obj({"id": _STR, "cluster": _null(_STR), "engine": _STR, "nodes": _INT,
                  "nproc_per_node": _INT,
                  "state": {"type": "string", "enum": ["starting", "ready", "busy"]},
                  "job": _null(_STR), "jobs_served": _INT, "created": _NUM,
                  "idle_seconds": _NUM, "idle_timeout": _NUM,
                  "node_hours": {**_NUM, "description": "nodes held x hours so far"}},
                 {"agents": {"type": "array", "items": _INT},
                  "engine_id": {**_null(_STR), "description": "the held allocation (a Slurm job id)"}},
                 "A warm pool: one agent per node with torch imported, serving one job at a time."),
    "Pools": _obj({"pools": {"type": "array", "items": _ref("Pool")}}),
    "DryRun": _obj({"engine": _STR, "job_id": _STR,
                    "request": _obj({
                        "engine": _STR, "cluster": _null(_STR),
                        "commands": {"type": "array", "items": {"type": "array", "items": _STR},
                                     "description": "the command lines, in order: torchrun per "
                                                    "node, ssh per host, sbatch"},
                        "hosts": {"type": "array", "items": _STR},
                        "labels": {"type": "array", "items": _STR},
                        "files": {"type": "object", "additionalProperties": _STR,
                                  "description": "documents sent: job.sbatch, the manifests"},
                        "env": {"type": "object", "additionalProperties": _STR},
                        "cwd": _null(_STR),
                        "native": {"type": "object", "description": (
                            "what only this engine's submit reads: SSH `payloads`, Kubernetes "
                            "`kind` and `manifests`")}},
                        description=("The engine's request as its `dry_run` makes it "
                                     "(engines.contract.DryRun). `env` holds what the launcher "
                                     "adds to its own environment; secrets are placeholders."))},
                   description="What a submit would ask the engine for its first attempt"),
    "Released": _obj({"released": {"type": "array", "items": _STR}}),
    "Health": _obj({"ok": {"type": "boolean"}, "pid": _INT, "version": _STR,
                    "started": _NUM,
                    "ingest": _obj({"pid": _null(_INT), "starts": _INT}, description=(
                        "the process that parses and stores rank reports "
                        "(launcher/ingest_worker.py); `starts` counts its restarts too"))},
                   {"warnings": {"type": "array", "items": _STR, "description": (
                       "what the launcher found wrong at its start, one line each (job "
                       "directories its store has no record of; a port it could not get back)")}},
                   "Asked with a nonce in `X-DLC-Nonce`, every answer of this route (a 401 "
                   "without the token too) carries `X-DLC-Proof`, which proves the launcher "
                   "with its connection file's `identity` key (jupyter_dlc/identity.py); "
                   "clients check it before they send the token. Report answers prove the "
                   "job's key the same way."),
}


def _json(schema_name: str, description: str = "OK") -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema_name)}}}


def _errors(*codes: int) -> dict:
    words = {400: "Bad input: the field and how to fix it", 401: "Missing or wrong token",
             404: "No such job or pool", 409: "Not possible in the job's state",
             413: "Body over this route's size limit",
             503: "Not stored: the ingest worker restarted with it in hand; send it again"}
    return {str(code): _json("Error", words[code]) for code in codes}


def _body(schema_name: str) -> dict:
    # Required on every POST route: clients always send a JSON object, `{}` at the least.
    return {"required": True,
            "content": {"application/json": {"schema": _ref(schema_name)}}}


def _query(name: str, description: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "integer", "minimum": 0}}


_JOB = {"name": "job", "in": "path", "required": True,
        "description": "A job id, a unique prefix of one, or `last`.", "schema": _STR}
_ON_JOB = (401, 404)
# A view past 8 ranks draws a band (jupyter_dlc/bands.py): it reads train points folded per step
# (past 8 rank rows of the current attempt).
_BAND_QUERY = [
    _query("band", "1: fold train points per step into `bands` (past 8 ranks)",
           {"type": "integer", "enum": [0, 1]}),
    _query("ranks", "with band=1: comma-separated ranks (at most 64) whose train points come "
                    "as points (the view's outlier lines)", _STR)]

# Path template → {method: operation}. The tornado routes in launcher/app.py map onto these
# one to one (tests/test_openapi.py checks it).
PATHS: dict[str, dict[str, Any]] = {
    "/healthz": {"get": {"operationId": "health", "responses": {
        "200": _json("Health"), **_errors(401)}}},
    "/metrics": {"get": {"operationId": "prometheus", "responses": {
        "200": {"description": "Prometheus text format",
                "content": {"text/plain": {"schema": _STR}}}, **_errors(401)}}},
    "/api/openapi.json": {"get": {"operationId": "openapi", "responses": {
        "200": {"description": "This document",
                "content": {"application/json": {"schema": _ANY_OBJ}}}, **_errors(401)}}},
    "/api/stream": {"get": {"operationId": "stream", "x-streaming": True, "responses": {
        "200": {"description": "Server-sent events: `job` (a JobSummary), `deleted` ({id}), "
                               "`alert`, `alert_resolved`, `diagnosis` (an Event).",
                "content": {"text/event-stream": {"schema": _STR}}}, **_errors(401)}}},
    "/api/jobs": {
        "get": {"operationId": "listJobs", "responses": {"200": _json("JobList"),
                                                         **_errors(401)}},
        "post": {"operationId": "submitJob", "requestBody": _body("JobSpec"),
                 "parameters": [_query(
                     "dry_run", "1: check the spec as a submit does and answer the engine's "
                     "native request for its first attempt (200, DryRun); nothing is stored",
                     {"type": "integer", "enum": [0, 1]})],
                 "responses": {"201": _json("JobDetail", "Queued"),
                               "200": _json("DryRun", "With dry_run=1: what would be submitted"),
                               **_errors(400, 401, 413)}}},
    "/api/jobs/{job}": {
        "parameters": [_JOB],
        "get": {"operationId": "getJob", "parameters": [
            _query("rank_sort", "with rank_page: the rank table's order (slowest step, oldest "
                                "heartbeat first)", {"type": "string", "enum": list(RANK_ORDERS)}),
            _query("rank_page", "only this page of the ranks (from 0), as `rank_page` says",
                   {"type": "integer", "minimum": 0, "maximum": 1 << 30}),
            _query("rank_page_size", "ranks a page (default 50)",
                   {"type": "integer", "minimum": 1, "maximum": 1000})],
            "responses": {"200": _json("JobDetail"), **_errors(400, *_ON_JOB)}},
        "delete": {"operationId": "deleteJob", "responses": {
            "204": {"description": "Deleted"}, **_errors(*_ON_JOB, 409)}}},
    "/api/jobs/{job}/stop": {"parameters": [_JOB], "post": {
        "operationId": "stopJob", "requestBody": _body("StopBody"), "description": (
            "Accepted at once: the job as it stands once the stop is recorded (STOPPING, then "
            "STOPPED after the grace; STOPPED at once for a job that had not started), or after "
            "a second while the stop waits for the job's submit to return; it goes on then."),
        "responses": {"202": _json("JobDetail", "Stop accepted"), **_errors(400, *_ON_JOB, 409, 413)}}},
    "/api/jobs/{job}/resume": {"parameters": [_JOB], "post": {
        "operationId": "resumeJob", "requestBody": _body("ResumeBody"),
        "responses": {"200": _json("JobDetail"), **_errors(400, *_ON_JOB, 409, 413)}}},
    "/api/jobs/{job}/clone": {"parameters": [_JOB], "post": {
        "operationId": "cloneJob", "requestBody": _body("EmptyBody"),
        "responses": {"201": _json("JobDetail", "The new job"),
                      **_errors(400, *_ON_JOB, 413)}}},
    "/api/jobs/{job}/report": {"parameters": [_JOB], "post": {
        "operationId": "report", "description": (
            "From a rank's runtime, or a node reporter's batch of its ranks' reports; the job "
            "token works too. Besides `checkpoint`, `nan` and "
            "`preempted`, `events` carry the rank's own records, so that no engine needs a "
            "filesystem shared with the launcher: `rank_start` (pid, node, local_rank, start), "
            "`rank_end` (exit_code, end; also sent for os._exit), `rank_error` (the first "
            "exception: error = its type, message, traceback's tail) and `node_preflight` "
            "(node, host, ok, message: a node's preflight, where the engine runs it on its "
            "nodes) and `node_exit` (node, exit_code, engine_id: a node's exit, where the "
            "launcher cannot read its exit file). A report of only these is not a heartbeat. "
            "`stacks` (main, threads) is a rank's answer to the `stacks` command of a suspected hang."),
        "requestBody": _body("Report"),
        "responses": {"200": _json("ReportAnswer"), **_errors(400, *_ON_JOB, 413, 503)}}},
    "/api/jobs/{job}/node-logs": {"parameters": [_JOB], "post": {
        "operationId": "nodeLogs", "description": (
            "From a node that does not see the launcher's job directory (Slurm without a shared "
            "filesystem), with the job token: new lines of its ranks' logs and its own, appended "
            "to the current attempt's rank-R.log and node-K.log. Only the node's own ranks; "
            "`stale` when the attempt has ended (nothing written)."),
        "requestBody": _body("NodeLogs"),
        "responses": {"200": _json("NodeLogsAnswer"), **_errors(400, *_ON_JOB, 413)}}},
    "/api/jobs/{job}/logs": {"parameters": [_JOB], "get": {
        "operationId": "jobLogs", "parameters": [
            _query("rank", "one rank (default: all); must exist in the job's world"),
            _query("tail", "the last N lines", {"type": "integer", "minimum": 0,
                                                "maximum": 1 << 20}),
            _query("attempt", "an earlier attempt", {"type": "integer", "minimum": 1,
                                                     "maximum": 1 << 30}),
            _query("cursor", "from a previous answer: only newer lines", _STR)],
        "responses": {"200": _json("Logs"), **_errors(400, *_ON_JOB)}}},
    "/api/jobs/{job}/metrics": {"parameters": [_JOB], "get": {
        "operationId": "jobMetrics", "parameters": [
            _query("since", "points after this seq", {"type": "integer", "minimum": 0,
                                                      "maximum": 2**63 - 1}), *_BAND_QUERY],
        "responses": {"200": _json("Metrics"), **_errors(400, *_ON_JOB)}}},
    "/api/jobs/{job}/metrics/stream": {"parameters": [_JOB], "get": {
        "operationId": "jobMetricsStream", "x-streaming": True, "parameters": [
            _query("since", "points after this seq", {"type": "integer", "minimum": 0,
                                                      "maximum": 2**63 - 1}), *_BAND_QUERY],
        "responses": {
            "200": {"description": "Server-sent events: `metrics` (a Metrics answer: the "
                                   "points stored after `since`, pushed as they are stored), "
                                   "`job` (a JobSummary, when it changed), `deleted` ({id}).",
                    "content": {"text/event-stream": {"schema": _STR}}},
            **_errors(400, *_ON_JOB)}}},
    "/api/jobs/{job}/events": {"parameters": [_JOB], "get": {
        "operationId": "jobEvents", "parameters": [
            _query("since", "events after this seq", {"type": "integer", "minimum": 0,
                                                      "maximum": 2**63 - 1})],
        "responses": {"200": _json("Events"), **_errors(400, *_ON_JOB)}}},
    "/api/jobs/{job}/checkpoints": {"parameters": [_JOB], "get": {
        "operationId": "jobCheckpoints",
        "description": "The committed steps in the job's checkpoint directory as its engine resolved "
                       "it for its attempts (SSH: the profile's `checkpoint_dir`; Kubernetes: "
                       "`launcher_pvc_dir`), oldest first, each with its `verification`.",
        "responses": {"200": _json("Checkpoints"), **_errors(*_ON_JOB)}}},
    "/api/jobs/{job}/diagnosis": {"parameters": [_JOB], "get": {
        "operationId": "jobDiagnosis",
        "responses": {"200": _json("Diagnoses"), **_errors(*_ON_JOB)}}},
    "/api/jobs/{job}/goodput": {"parameters": [_JOB], "get": {
        "operationId": "jobGoodput",
        "description": "The job's goodput ledger: wall time since submit split into waiting, "
                       "start-up, productive steps, data wait, checkpoint stall, lost work, "
                       "restart downtime, hung, stopped and shutdown, and its progress.",
        "responses": {"200": _json("Goodput"), **_errors(*_ON_JOB)}}},
    "/api/jobs/{job}/evidence": {"parameters": [_JOB], "get": {
        "operationId": "jobEvidence",
        "description": "The evidence folders kept before hung or failing attempts were killed, "
                       "oldest first.",
        "responses": {"200": _json("Evidence"), **_errors(*_ON_JOB)}}},
    "/api/jobs/{job}/alerts": {"parameters": [_JOB], "get": {
        "operationId": "jobAlerts", "responses": {"200": _json("Alerts"), **_errors(*_ON_JOB)}}},
    "/api/pools": {
        "get": {"operationId": "listPools", "responses": {"200": _json("Pools"), **_errors(401)}},
        "post": {"operationId": "poolUp", "requestBody": _body("PoolUpBody"),
                 "responses": {"201": _json("Pool", "Started (or already up)"),
                               **_errors(400, 401, 413)}}},
    "/api/pools/down": {"post": {
        "operationId": "poolDown", "requestBody": _body("PoolDownBody"),
        "responses": {"200": _json("Released"), **_errors(400, 401, 413)}}},
    "/api/pools/{pool}": {
        "parameters": [{"name": "pool", "in": "path", "required": True,
                        "description": "A pool id as listed, e.g. local-2x2.", "schema": _STR}],
        "delete": {"operationId": "releasePool", "responses": {
            "200": _json("Released"), **_errors(401, 404)}}},
    "/api/jobs/{job}/script": {"parameters": [_JOB], "get": {
        "operationId": "jobScript", "responses": {"200": _json("Script"), **_errors(*_ON_JOB)}}},
}


# Any route: a request line (path and query) past the launcher's limit (app.REQUEST_LINE_LIMIT).
for _operations in PATHS.values():
    for _method, _operation in _operations.items():
        if _method != "parameters":
            _operation["responses"]["414"] = _json("Error", "Request line (path and query) over "
                                                            "the launcher's limit")


def document() -> dict:
    """The OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {"title": "jupyter-dlc launcher", "version": __version__,
                 "description": "Loopback HTTP API of the jupyter-dlc launcher. Every route "
                                "needs the token from the launcher's connection file."},
        "paths": PATHS,
        "components": {
            "schemas": dict(SCHEMAS, ClusterProfile=clusters.profile_schema()),
            "securitySchemes": {
                "token": {"type": "apiKey", "in": "header", "name": "Authorization",
                          "description": "`token <TOKEN>` or `Bearer <TOKEN>`"},
                "query": {"type": "apiKey", "in": "query", "name": "token"}}},
        "security": [{"token": []}, {"query": []}],
    })


if __name__ == "__main__":  # `python -m jupyter_dlc.launcher.openapi`: the document, as the panel's
    # type generation reads it (labextension/openapi.json)
    print(json.dumps(document(), indent=1, sort_keys=True))
