"""The launcher's HTTP API (tornado): routes, the token check on every one, bodies, status codes
and streams. What a route does apart from HTTP is operations.py (submit, delete, resume, a
job's detail, logs, metrics) over the store and the supervisor; answers are encoded by
answers.py. See ARCHITECTURE.md."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import os
import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import tornado.web

from .. import __version__, bands, identity, layout
from . import openapi
from ..spec import JobSpec, SpecError, require_absolute_paths, show
from ..states import ACTIVE_STATES, ALL_STATES, TERMINAL_STATES
from .. import bodies
from . import evidence, goodput, node_logs
from .alerts import rules_for
from .committed import Committed
from .ingest_worker import IngestWorker
from .pacing import ReportPacer
from .retention import RetentionPolicy
from .answers import _clean, encode
from .operations import (
    NoSpace,
    Refused,
    checked_dry_run,
    checked_submit,
    delete_job,
    job_detail,
    metrics_answer,
    performance_of,
    pool_up,
    read_logs,
    release_pool,
    resume_job,
    script_of,
    submit,
)
from .store import RANK_ORDERS, Store
from .supervisor import Supervisor

log = logging.getLogger("jupyter_dlc.launcher")

# The longest a delete waits for a stop in flight to end.
STOP_WAIT = 10.0
# The event loop answers every rank's report, so it never waits on an engine: the work of
# an action (a stop's engine call, a delete's process scan, a submit's capacity check such as
# Slurm's sinfo, a pool's allocation) runs on these workers. A stop may wait there for its
# job's start to finish (an sbatch of up to 30 s: supervisor.request_stop).
ACTION_WORKERS = 8
# How long a stop's answer waits for the stop to be recorded (STOPPING, or STOPPED for a job
# that had not started) before it answers 202 with the job as it stands; the stop goes on.
ACTION_WAIT = 1.0


class Launcher:
    """What the handlers share: the store, the supervisor, the token."""

    def __init__(self, store: Store, supervisor: Supervisor, data_dir: str, token: str,
                 retention: RetentionPolicy | None = None, pacer: ReportPacer | None = None,
                 warnings: list[str] | None = None):
        self.store = store
        # Summaries carry goodput and progress; the goodput route answers the whole ledger.
        self.ledger = store.ledger = goodput.Ledger(store)
        self.supervisor = supervisor
        self.data_dir = data_dir
        self.token = token
        # The data dir's identity (identity.py): what /healthz and report answers prove.
        self.secret = identity.launcher_secret(data_dir)
        self.client_key = identity.client_key(self.secret)
        # What the launcher found wrong at start (a store that lost its jobs), for /healthz.
        self.warnings = list(warnings or [])
        self.started = time.time()
        # Metrics reads, a job's detail and the list are built on reader threads (their own
        # SQLite connections), so that a large answer never holds up the event loop.
        self.readers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dlc-reads")
        # Reports are parsed, stored and their metrics retained in a process of their own
        # (ingest_worker.py): the loop here only checks the token and answers.
        self.ingest = IngestWorker(store.path, data_dir, retention or RetentionPolicy())
        self.pacer = pacer or ReportPacer()
        self.committed = Committed()  # wakes a job's metrics streams at each report's commit
        self.actions = ThreadPoolExecutor(max_workers=ACTION_WORKERS, thread_name_prefix="dlc-actions")
        self._stops: dict[str, Future] = {}  # job -> its stop in flight (touched on the loop only)
        self._worlds: dict[str, int] = {}

    def stop(self, job_id: str, grace: float | None) -> Future:
        """Queue a stop of the job to an action worker; a stop already in flight for it (one
        waiting for the job's submit) is joined rather than queued twice."""
        self._stops = {job: f for job, f in self._stops.items() if not f.done()}
        future = self._stops.get(job_id)
        if future is None:
            future = self.actions.submit(self.supervisor.request_stop, job_id, grace)
            future.add_done_callback(_log_failure)
            self._stops[job_id] = future
        return future

    def stop_in_flight(self, job_id: str) -> Future | None:
        future = self._stops.get(job_id)
        return future if future is not None and not future.done() else None

    def world(self, job_id: str) -> int:
        """The job's number of ranks, which its reports' ranks must be under. A spec never
        changes, and the report route runs thousands of times a second: read once a job."""
        world = self._worlds.get(job_id)
        if world is None:
            row = self.store.job_row(job_id)
            if row is None:  # deleted meanwhile: nothing of it is stored anyway
                return 1 << 20
            spec = json.loads(row["spec"])
            world = self._worlds[job_id] = spec["nodes"] * spec["nproc_per_node"]
        return world


def _log_failure(future: Future) -> None:
    error = future.exception()
    if error is not None:
        log.error("a stop failed: %s", error, exc_info=error)


async def settled(future: Future, wait: float) -> bool:
    """Whether an action's work ended within `wait` seconds. Waiting holds up nothing else
    on the loop, and the work goes on when the answer does not wait for it."""
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait)
    except asyncio.TimeoutError:
        return False
    except Exception:  # noqa: BLE001 - logged where it failed; the answer is the job as it stands
        return True
    return True


# Request bodies are read in pieces and capped per route (413 beyond), so that a huge body is
# refused before it is buffered or parsed, and the event loop stays free for /healthz.
BODY_LIMIT = 64 << 10
SUBMIT_LIMIT = 8 << 20      # a cell body of up to 4 MB, with room for JSON escaping
REPORT_LIMIT = 8 << 20      # a rank's largest batch is under 1 MB; a node's reporter splits at 4 MB
SEQ_MAX = 2**63 - 1         # SQLite's INTEGER range
# The longest request line (path and query) answered: a log cursor of the largest world
# (LogsHandler.cursor_arg: 64 + 40 bytes a rank, 1,024 nodes x 64) fits. Tornado buffers the
# request line and headers up to its max_header_size (64 KiB by default) and closes the
# connection without a word past it, so the server is given more (HEADER_LIMIT, __main__.py)
# and a longer line gets a 414 here.
REQUEST_LINE_LIMIT = 3 << 20
HEADER_LIMIT = REQUEST_LINE_LIMIT + (1 << 20)


@tornado.web.stream_request_body
class BaseHandler(tornado.web.RequestHandler):
    launcher: Launcher
    body_limit = BODY_LIMIT

    def initialize(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self._chunks: list[bytes] = []
        self._received = 0

    def check_sizes(self) -> None:
        """414 for a request line over the limit; 413 from the declared length (a chunked body
        is cut by the connection at the cap)."""
        if len(self.request.uri or "") > REQUEST_LINE_LIMIT:
            self.fail(414, f"query: the request line is {len(self.request.uri or '')} bytes; at most "
                           f"{REQUEST_LINE_LIMIT} are allowed (send fewer or shorter arguments)")
        length = self.request.headers.get("Content-Length")
        if length and (not length.isdigit() or int(length) > self.body_limit):
            self.fail(413, f"body: larger than this route's limit of {self.body_limit} bytes")
        self.request.connection.set_max_body_size(self.body_limit)

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received <= self.body_limit:
            self._chunks.append(chunk)

    @property
    def store(self) -> Store:
        return self.launcher.store

    def presented_token(self) -> str:
        header = self.request.headers.get("Authorization", "")
        if header.lower().startswith("token "):
            return header[6:].strip()
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        return self.get_query_argument("token", "")

    def allowed(self, token: str) -> bool:
        # As bytes: compare_digest refuses str with non-ASCII characters (TypeError, a 500),
        # and a header is read as Latin-1, so a client can send any.
        return hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self.launcher.token.encode())

    def prepare(self) -> None:
        if not self.allowed(self.presented_token()):
            self.fail(401, "token: missing or wrong; read it from the launcher's connection file")
        self.check_sizes()

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))
        raise tornado.web.Finish()

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(encode(data))

    async def reply_off_loop(self, answer: Callable[[], Any], status: int = 200) -> None:
        """Build and encode an answer on a reader thread (its own SQLite connection): a job's
        detail with thousands of ranks, the list, a job's logs or checkpoints (files read)
        cost tens of milliseconds, which the event loop spends answering reports meanwhile."""
        body = await asyncio.get_running_loop().run_in_executor(
            self.launcher.readers, lambda: encode(answer()))
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body)

    async def reply_job(self, job_id: str, status: int = 200) -> None:
        """The job's detail as it stands now."""
        def detail() -> dict:
            row = self.store.job_row(job_id)
            if row is None:
                raise tornado.web.HTTPError(404, reason=f"job: {job_id} was deleted meanwhile")
            return job_detail(self.store, row)
        await self.reply_off_loop(detail, status)

    async def off_loop(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run an action's work on an action worker (engine calls, subprocesses, file scans)
        and wait for it without holding up the loop; a `Refused` is answered 400, a
        `NoSpace` 507."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.launcher.actions, work, *args)
        except Refused as refusal:
            self.fail(400, str(refusal))
        except NoSpace as full:
            raise tornado.web.HTTPError(507, reason=str(full)) from None

    def body(self, schema: dict | None = None) -> dict:
        """The JSON object sent, checked against `schema` (bodies.py) when one is given."""
        try:
            return bodies.parse_body(b"".join(self._chunks), schema)
        except SpecError as error:
            self.fail(400, str(error))

    def job_or_404(self, ref: str):
        job_id = self.store.resolve_id(ref)
        row = self.store.job_row(job_id) if job_id else None
        if row is None:
            self.fail(404, f"job: no job {show(ref)}; `jupyter-dlc list` shows the jobs")
        return row

    def int_arg(self, name: str, default: int | None = None, low: int = 0,
                high: int = SEQ_MAX) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw in (None, ""):
            return default
        if not (raw.isascii() and raw.lstrip("-").isdigit()):
            self.fail(400, f"{name}: expected a whole number, got {show(raw)}")
        value = int(raw) if len(raw) <= 24 else None
        if value is None or not low <= value <= high:
            self.fail(400, f"{name}: must be between {low} and {high}, got {show(raw)}")
        return value

    def band_arg(self, row) -> frozenset | None:
        """A view's `band=1` and `ranks=` (bands.py): the ranks whose train points it wants as
        points, or None when it wants every point (no band asked, or few ranks to draw)."""
        if not self.int_arg("band", 0, 0, 1):
            return None
        try:
            keep = bands.parse_ranks(self.get_query_argument("ranks", ""))
        except ValueError as error:
            self.fail(400, f"ranks: {error}")
        return keep if self.store.rank_count(row["id"], row["attempt"]) > bands.MAX_RANK_LINES else None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": self._reason}))


class ProvingHandler(BaseHandler):
    """A route whose every answer (a 401 too) proves the launcher to whoever sent a nonce
    (identity.py): an HMAC of the request and the answer, with a key of `proof_key`."""

    _request_digest: str | None = None

    def proof_key(self) -> str:
        raise NotImplementedError

    def finish(self, chunk: Any = None) -> Any:
        nonce = self.request.headers.get(identity.NONCE_HEADER)
        if nonce and not self._finished:
            if chunk is not None:
                self.write(chunk)
                chunk = None
            if self._request_digest is None:
                self._request_digest = identity.digest(b"".join(self._chunks))
            self.set_header(identity.PID_HEADER, str(os.getpid()))
            self.set_header(identity.PROOF_HEADER, identity.proof(
                self.proof_key(), self.request.method or "GET", self.request.path, nonce[:200],
                self._request_digest, self.get_status(), b"".join(self._write_buffer)))
        return super().finish(chunk)


class HealthHandler(ProvingHandler):
    """Clients ask here first, without the token: the 401 proves the launcher with the
    connection file's client key, and only then do they send the token."""

    def proof_key(self) -> str:
        return self.launcher.client_key

    def get(self) -> None:
        ingest = self.launcher.ingest
        self.reply({"ok": True, "pid": os.getpid(), "version": __version__,
                    "started": self.launcher.started, "warnings": self.launcher.warnings,
                    "ingest": {"pid": ingest.process.pid if ingest.process else None,
                               "starts": ingest.starts}})


class JobsHandler(BaseHandler):
    body_limit = SUBMIT_LIMIT

    async def get(self) -> None:
        await self.reply_off_loop(lambda: {"jobs": [self.store.summary(r) for r in self.store.job_rows()]})

    async def post(self) -> None:
        try:
            spec = JobSpec.from_dict(self.body())
            require_absolute_paths(spec)
            rules = rules_for(spec.alerts, spec.default_alerts)  # a rule that does not parse is refused now
            best = next((r for r in rules if r.kind == "sweep_best"), None)
            if best is not None and spec.sweep is None:
                raise SpecError("alerts", f"{best.text!r}: 'best' is the best of a sweep's trials at "
                                "the same step; give the rule to a sweep (--sweep NAME=VALUES)")
        except (SpecError, TypeError) as error:
            self.fail(400, str(error))
        dry = self.get_query_argument("dry_run", "")
        if dry not in ("", "0", "1"):
            self.fail(400, f"dry_run: {dry!r} is not 1 or 0; give dry_run=1 to see the engine's "
                           "request without submitting")
        if dry == "1":
            self.reply(await self.off_loop(checked_dry_run, self.launcher, spec))
            return
        self.reply(await self.off_loop(checked_submit, self.launcher, spec), 201)


class JobHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        rank_page = None
        order = self.get_query_argument("rank_sort", None)
        page = self.int_arg("rank_page", None, 0, 1 << 30)
        size = self.int_arg("rank_page_size", 50, 1, 1000)  # checked even where unused, as every argument
        if order is not None or page is not None:
            if order is not None and order not in RANK_ORDERS:
                self.fail(400, f"rank_sort: expected one of {', '.join(RANK_ORDERS)}, got {show(order)}")
            rank_page = (order or "rank", page or 0, size)
        await self.reply_off_loop(lambda: job_detail(self.store, row, rank_page))

    async def delete(self, ref: str) -> None:
        row = self.job_or_404(ref)
        # A stop in flight ends within its grace, at once for a job that had not started:
        # a delete right after it waits for that end rather than answering 409. First for
        # the stop to be recorded, when it still waits on an action worker.
        deadline = time.time() + STOP_WAIT
        stop = self.launcher.stop_in_flight(row["id"])
        if stop is not None:
            await settled(stop, STOP_WAIT)
            row = self.job_or_404(ref)
        while row["state"] == "STOPPING" and time.time() < min(deadline, (row["stop_requested"] or 0) + 2):
            await asyncio.sleep(0.05)
            row = self.job_or_404(ref)
        if row["state"] in ACTIVE_STATES:
            self.fail(409, f"job: {row['id']} is {row['state']}; stop it first")
        await self.off_loop(delete_job, self.launcher, row)
        self.set_status(204)
        self.finish()


class ActionHandler(BaseHandler):
    """stop, resume, clone. Their work runs on the action workers, so no answer waits on an
    engine and none holds up the loop. A stop answers 202 with the job once the stop is
    recorded (STOPPING, or STOPPED for a job that had not started) or after ACTION_WAIT,
    whichever comes first: it may wait for the job's submit to return, and goes on then."""

    async def post(self, ref: str, action: str) -> None:
        row = self.job_or_404(ref)
        body = self.body(ACTION_BODIES.get(action, bodies.EMPTY))
        if action == "stop":
            if row["state"] in TERMINAL_STATES:
                self.fail(409, f"job: {row['id']} already ended ({row['state']})")
            stop = self.launcher.stop(row["id"], body.get("grace"))
            if await settled(stop, ACTION_WAIT) and stop.exception() is None and not stop.result():
                self.fail(409, f"job: {row['id']} already ended ({self.store.state(row['id'])})")
            # Accepted: STOPPING, then STOPPED (or STOPPED at once), or still waiting for the job's submit.
            await self.reply_job(row["id"], 202)
        elif action == "resume":
            if row["state"] not in TERMINAL_STATES:
                self.fail(409, f"job: {row['id']} is {row['state']}; only an ended job can be resumed")
            await self.off_loop(resume_job, self.launcher, row, body.get("step"))
            await self.reply_job(row["id"])
        elif action == "clone":
            spec = JobSpec.from_dict(json.loads(row["spec"]))
            if spec.code is None:
                spec.script = os.path.join(row["job_dir"], "script.py")
            spec.files = {name: os.path.join(row["job_dir"], "files", name) for name in spec.files}
            self.reply(await self.off_loop(submit, self.launcher, spec), 201)
        else:
            self.fail(404, f"action: unknown {action!r}; use stop, resume or clone")


ACTION_BODIES = {"stop": bodies.STOP, "resume": bodies.RESUME, "clone": bodies.EMPTY}


class ReportHandler(ProvingHandler):
    body_limit = REPORT_LIMIT

    def prepare(self) -> None:
        # The token is checked in post (the job's own token is accepted here too); the size now.
        self.check_sizes()

    def proof_key(self) -> str:
        # The key the job's ranks hold (supervisor.py puts it in their environment).
        return identity.job_key(self.launcher.secret, self.path_args[0] if self.path_args else "")

    def job_by_token(self, ref: str) -> sqlite3.Row:
        """The job's report row (id, token hash, attempt), once the job's current token (or
        the launcher's) is presented: 401 otherwise, before anything says whether it exists."""
        row = self.store.report_row(ref)
        token = self.presented_token()
        if row is None:
            if not self.allowed(token):
                self.fail(401, "token: missing or wrong")
            self.fail(404, f"job: no job {show(ref)}")
        if not (self.allowed(token) or self.store.token_matches(row, token)):
            self.fail(401, "token: missing or wrong for this job")
        return row

    async def post(self, ref: str) -> None:
        body = b"".join(self._chunks)
        hashing = None
        if self.request.headers.get(identity.NONCE_HEADER) and len(body) > 1 << 16:
            # A node's batch of megabytes is hashed beside the ingest worker, off the loop
            # (hashlib lets go of the GIL).
            hashing = asyncio.get_running_loop().run_in_executor(None, identity.digest, body)
        row = self.job_by_token(ref)
        status, sent = await self.launcher.ingest.submit(row["id"], row["attempt"],
                                                         self.launcher.world(row["id"]), body)
        if hashing is not None:
            self._request_digest = await hashing
        if status != 200:
            self.fail(status, sent)
        if sent["stale"]:
            # A straggler of an attempt that already ended: accepted, not stored, and given no
            # command (a "stop" would make it save into the checkpoints the new attempt writes).
            self.reply({"ok": True, "commands": [], "rank_commands": {}, "stale": True})
            return
        self.store.version += 1  # committed by the worker: the views' streams look again
        self.launcher.committed.notify(row["id"])
        if sent.get("ended"):
            # A rank ended or failed: the verdict (and a restart) need not wait for a tick.
            self.launcher.supervisor.wake.set()
        commands_for = self.launcher.supervisor.commands_for
        batch = "ranks" in sent
        sender = (row["id"], "node", sent["node"]) if batch else (row["id"], "rank", sent["rank"])
        answer: dict[str, Any] = {"ok": True, "commands": [],
                                  "report_interval": self.launcher.pacer.heard(sender)}
        if not batch:
            answer["commands"] = commands_for(row["id"], sent["rank"])
        else:
            answer["rank_commands"] = {str(rank): commands for rank in sent["ranks"]
                                       if (commands := commands_for(row["id"], rank))}
        self.reply(answer)


class NodeLogsHandler(ReportHandler):
    """New lines of a node's logs, from a node that does not see the job directory
    (launcher/node_logs.py): the job's token, as the report route, and proven answers."""

    body_limit = 2 * bodies.NODE_LOG_BYTES + BODY_LIMIT  # JSON escaping of 1 MB of text

    async def post(self, ref: str) -> None:
        row = self.job_by_token(ref)
        sent = self.body(bodies.NODE_LOGS)
        if sent["attempt"] != row["attempt"]:
            # A node of an attempt that already ended: its lines belong to nobody now.
            self.reply({"ok": True, "stale": True})
            return
        job = self.store.job_row(row["id"])
        if job is None:
            self.fail(404, f"job: {show(ref)} was deleted meanwhile")
        spec = json.loads(job["spec"])
        try:
            node_logs.check(sent, spec["nodes"], spec["nproc_per_node"])
        except SpecError as error:
            self.fail(400, str(error))
        attempt_dir = layout.attempt_dir(job["job_dir"], sent["attempt"])
        await asyncio.get_running_loop().run_in_executor(None, node_logs.append, attempt_dir, sent)
        self.reply({"ok": True})


class LogsHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        spec = json.loads(row["spec"])
        world = spec["nodes"] * spec["nproc_per_node"]
        rank = self.int_arg("rank")
        if rank is not None and rank >= world:
            self.fail(400, f"rank: rank {rank} does not exist in a world of {world} "
                           f"(ranks 0-{world - 1})")
        tail = self.int_arg("tail", high=1 << 20)
        attempt = self.int_arg("attempt", row["attempt"], low=1, high=1 << 30)
        raw_cursor = self.get_query_argument("cursor", "")
        cursor = self.cursor_arg(raw_cursor, world)
        if cursor.get("attempt") not in (None, attempt):
            cursor = {}
        ranks = [rank] if rank is not None else list(range(world))
        # Up to 2 MB of every rank's log, through the job's engine: on a reader thread.
        await self.reply_off_loop(lambda: read_logs(self.launcher.supervisor, row, attempt, ranks,
                                                    cursor.get("offsets", {}),
                                                    tail if not raw_cursor else None))

    def cursor_arg(self, raw: str, world: int) -> dict:
        """A cursor this launcher returned: {"attempt": n, "offsets": {"rank": byte offset}}."""
        if not raw:
            return {}
        try:
            if len(raw) > 64 + 40 * world:
                raise ValueError
            cursor = json.loads(base64.urlsafe_b64decode(raw.encode("ascii")))
            bodies.check(cursor, CURSOR, "cursor")
            if not all(key.isdigit() and int(key) < world for key in cursor.get("offsets", {})):
                raise ValueError
        except (ValueError, RecursionError, SpecError):
            self.fail(400, "cursor: not a cursor this launcher returned; leave it out to start over")
        return cursor


CURSOR = {"type": "object", "additionalProperties": False, "properties": {
    "attempt": {"type": "integer", "minimum": 1, "maximum": 1 << 30},
    "offsets": {"type": "object", "additionalProperties": {
        "type": "integer", "minimum": 0, "maximum": SEQ_MAX}}}}


class MetricsHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        since = self.int_arg("since", 0) or 0
        keep = self.band_arg(row)
        # Up to 20,000 points: read and encoded on a reader thread (its own SQLite connection),
        # so that a view's large answer never holds up the reports on the event loop.
        body, _last = await asyncio.get_running_loop().run_in_executor(
            self.launcher.readers, metrics_answer, self.store, row["id"], since, keep)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class EventsHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        since = self.int_arg("since", 0) or 0
        await self.reply_off_loop(lambda: {"events": self.store.events(row["id"], since)})


class CheckpointsHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        supervisor = self.launcher.supervisor

        def answer() -> dict:  # a directory scan and manifests read: off the event loop
            reported = {c["step"]: c for c in supervisor.store.checkpoints(row["id"])}
            out = []
            # The file system decides what is committed (in the directory the engine resolved
            # for the job's attempts); the reports add timing and what the ranks verified.
            for record in supervisor.checkpoint_steps(row):
                extra = reported.get(record["step"], {})
                out.append(dict(record, seconds=extra.get("seconds"), attempt=extra.get("attempt")))
            return {"checkpoints": out}

        await self.reply_off_loop(answer)


class GoodputHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        await self.reply_off_loop(lambda: self.launcher.ledger.ledger(row))


class DiagnosisHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        def answer() -> dict:
            out = []
            for a in self.store.attempt_rows(row["id"]):
                if a["failure"]:
                    out.append(dict(json.loads(a["failure"]), attempt=a["attempt"],
                                    reason=a["reason"]))
                elif a["outcome"] in FAILED_OUTCOMES:
                    # Failed on the launcher's verdict with no rank error to show (heartbeats
                    # missed, max runtime, the engine's word): the verdict is the explanation.
                    out.append({"class": "launcher_verdict", "line": a["reason"], "rank": None,
                                "suggestion": None, "attempt": a["attempt"], "reason": a["reason"]})
            # A job that did not fail gets the performance verdict (performance.py) instead.
            return {"diagnoses": out,
                    "verdict": None if row["state"] == "FAILED" else performance_of(self.store, row)}

        await self.reply_off_loop(answer)


FAILED_OUTCOMES = ("failed", "timeout", "cancelled")


class EvidenceHandler(BaseHandler):
    """The evidence folders kept before a kill (evidence.py), one index per attempt."""

    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        await self.reply_off_loop(lambda: {"evidence": evidence.listing(row["job_dir"])})


class AlertsHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        await self.reply_off_loop(lambda: {
            "alerts": self.store.alert_summary(row)["alerts"],
            "events": self.store.events(row["id"], types=("alert", "alert_resolved"))})


class ScriptHandler(BaseHandler):
    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        await self.reply_off_loop(lambda: script_of(row["job_dir"]))


class StreamHandler(BaseHandler):
    """Server-sent events: a job summary whenever it changes, and alert events."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        sent: dict[str, dict] = {}
        readers = self.launcher.readers
        loop = asyncio.get_running_loop()
        alert_seq = await loop.run_in_executor(readers, self._last_seq)
        last_ping = 0.0
        seen_version = -1
        try:
            while True:
                if self.store.version == seen_version:
                    if time.time() - last_ping > 15:
                        self.write(": ping\n\n")
                        last_ping = time.time()
                        await self.flush()
                    await asyncio.sleep(0.25)
                    continue
                seen_version = self.store.version
                # Every job's summary and the new alerts: read on a reader thread, as the list is.
                text, alert_seq = await loop.run_in_executor(readers, self._changes, sent, alert_seq)
                self.write(text)
                if time.time() - last_ping > 15:
                    self.write(": ping\n\n")
                    last_ping = time.time()
                await self.flush()
                await asyncio.sleep(0.25)
        except tornado.iostream.StreamClosedError:
            return

    def _last_seq(self) -> int:
        return self.store.last_event_seq()

    def _changes(self, sent: dict[str, dict], alert_seq: int) -> tuple[str, int]:
        """The events for what changed since `sent` (updated) and alert event `alert_seq`."""
        out = []
        rows = self.store.job_rows()
        for row in rows:
            summary = _clean(self.store.summary(row))
            if sent.get(row["id"]) != summary:
                sent[row["id"]] = summary
                out.append(f"event: job\ndata: {json.dumps(summary)}\n\n")
        for job_id in set(sent) - {r["id"] for r in rows}:
            sent.pop(job_id)
            out.append(f"event: deleted\ndata: {json.dumps({'id': job_id})}\n\n")
        for event in self.store.event_rows_since(alert_seq, ("alert", "alert_resolved", "diagnosis")):
            alert_seq = event["seq"]
            out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
        return "".join(out), alert_seq


class MetricsStreamHandler(BaseHandler):
    """Server-sent events of one job: `metrics` ({points, last_seq}: every point stored after
    `since`, in seq order) as soon as a write committed, and `job` (its JobSummary) when the
    summary changed. The views follow this instead of polling `metrics?since=`; a view that
    loses it falls back to polling from its last seq, so no point is lost either way."""

    # How often the store's write counter is looked at (no SQL when unchanged) for writes
    # other than reports' (a report's commit wakes the stream at once: committed.py), and the
    # least time between two reads of one stream (a busy job's reports commit many times a
    # second; a read takes what came in between).
    CHECK_S = 0.02
    MIN_GAP_S = 0.005
    PING_S = 5.0        # a comment line this often, so a client (and we) notice a dead peer

    def on_connection_close(self) -> None:
        self._gone = True

    async def get(self, ref: str) -> None:
        row = self.job_or_404(ref)
        job_id = row["id"]
        since = self.int_arg("since", 0) or 0
        keep = self.band_arg(row)
        self._gone = False
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.write("retry: 1000\n\n")
        summary = None
        seen_version = -1
        last_ping = time.time()
        try:
            while not self._gone:
                version = self.store.version
                if version != seen_version:
                    seen_version = version
                    # Read and encoded on a reader thread, as the metrics route's: a view of
                    # thousands of ranks gets tens of thousands of points a second.
                    pages, since, current = await asyncio.get_running_loop().run_in_executor(
                        self.launcher.readers, self._changes, job_id, since, keep)
                    for data in pages:
                        self.write(b"event: metrics\ndata: " + data + b"\n\n")
                    if current is None:
                        self.write(f"event: deleted\ndata: {json.dumps({'id': job_id})}\n\n")
                        await self.flush()
                        return
                    if current != summary:
                        summary = current
                        self.write(f"event: job\ndata: {json.dumps(summary)}\n\n")
                    await self.flush()
                if time.time() - last_ping > self.PING_S:
                    self.write(": ping\n\n")
                    last_ping = time.time()
                    await self.flush()
                await asyncio.sleep(self.MIN_GAP_S)
                if self.store.version == seen_version:
                    await self.launcher.committed.wait(job_id, self.CHECK_S)
        except tornado.iostream.StreamClosedError:
            return

    def _changes(self, job_id: str, since: int,
                 keep: frozenset | None) -> tuple[list[bytes], int, dict | None]:
        """Every point after `since`, encoded in pages of what the store answers; the new seq;
        the job's summary (None: it was deleted)."""
        pages = []
        while True:
            data, last = metrics_answer(self.store, job_id, since, keep)
            if last == since:
                break
            pages.append(data)
            since = last
        row = self.store.job_row(job_id)
        return pages, since, None if row is None else _clean(self.store.summary(row))


class PrometheusHandler(BaseHandler):
    async def get(self) -> None:
        rows = await asyncio.get_running_loop().run_in_executor(self.launcher.readers, self.store.job_rows)
        lines = ["# HELP dlc_jobs Jobs by state.", "# TYPE dlc_jobs gauge"]
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        for state in ALL_STATES:
            lines.append(f'dlc_jobs{{state="{state}"}} {counts.get(state, 0)}')
        lines += ["# HELP dlc_job_step Last step reported.", "# TYPE dlc_job_step gauge"]
        lines += [f'dlc_job_step{{job="{r["id"]}"}} {r["last_step"]}' for r in rows
                  if r["last_step"] is not None]
        lines += ["# HELP dlc_job_loss Last loss reported by rank 0.", "# TYPE dlc_job_loss gauge"]
        lines += [f'dlc_job_loss{{job="{r["id"]}"}} {r["last_loss"]}' for r in rows
                  if r["last_loss"] is not None]
        ledgers = await asyncio.get_running_loop().run_in_executor(
            self.launcher.readers, lambda: [self.launcher.ledger.ledger(r) for r in rows])
        lines += ["# HELP dlc_job_goodput_ratio Productive step time over wall time since submit.",
                  "# TYPE dlc_job_goodput_ratio gauge"]
        lines += [f'dlc_job_goodput_ratio{{job="{g["job"]}"}} {g["goodput"]:.6g}' for g in ledgers
                  if g["goodput"] is not None]
        lines += ["# HELP dlc_job_time_seconds Wall time since submit by where it went "
                  "(launcher/goodput.py).", "# TYPE dlc_job_time_seconds gauge"]
        lines += [f'dlc_job_time_seconds{{job="{g["job"]}",part="{part}"}} {seconds:.6g}'
                  for g in ledgers for part, seconds in g["parts"].items()]
        self.set_header("Content-Type", "text/plain; version=0.0.4")
        self.finish("\n".join(lines) + "\n")


class PoolsHandler(BaseHandler):
    """Warm pools (launcher/pools.py): list, start one for a shape, release by shape. Each
    asks the engines (a process scan, squeue, an allocation's sbatch, scancel): on an
    action worker."""

    async def get(self) -> None:
        self.reply({"pools": await self.off_loop(self.launcher.supervisor.pools.status)})

    async def post(self) -> None:
        body = self.body(bodies.POOL_UP)
        self.reply(await self.off_loop(pool_up, self.launcher.supervisor.pools, body), 201)


class PoolsDownHandler(BaseHandler):
    async def post(self) -> None:
        body = self.body(bodies.POOL_DOWN)
        everything = not any(body.get(k) is not None for k in body)
        self.reply({"released": await self.off_loop(lambda: self.launcher.supervisor.pools.down(
            body.get("nodes"), body.get("nproc_per_node"), body.get("cluster"), everything=everything))})


class PoolHandler(BaseHandler):
    async def delete(self, pool_id: str) -> None:
        released = await self.off_loop(release_pool, self.launcher.supervisor.pools, pool_id)
        if released is None:
            self.fail(404, f"pool: no pool {pool_id[:80]!r}; list them with GET /api/pools")
        self.reply({"released": released})


class OpenApiHandler(BaseHandler):
    def get(self) -> None:
        self.reply(openapi.document())


class NotFoundHandler(BaseHandler):
    def get(self, *_: Any) -> None:
        self.fail(404, f"route: {self.request.path} does not exist")

    post = delete = get


def make_app(launcher: Launcher) -> tornado.web.Application:
    job = r"/api/jobs/([^/]+)"
    args = {"launcher": launcher}
    return tornado.web.Application([
        (r"/healthz", HealthHandler, args),
        (r"/metrics", PrometheusHandler, args),
        (r"/api/openapi.json", OpenApiHandler, args),
        (r"/api/stream", StreamHandler, args),
        (r"/api/jobs", JobsHandler, args),
        (job, JobHandler, args),
        (job + r"/(stop|resume|clone)", ActionHandler, args),
        (job + r"/report", ReportHandler, args),
        (job + r"/logs", LogsHandler, args),
        (job + r"/node-logs", NodeLogsHandler, args),
        (job + r"/metrics", MetricsHandler, args),
        (job + r"/metrics/stream", MetricsStreamHandler, args),
        (job + r"/events", EventsHandler, args),
        (job + r"/checkpoints", CheckpointsHandler, args),
        (job + r"/diagnosis", DiagnosisHandler, args),
        (job + r"/goodput", GoodputHandler, args),
        (job + r"/evidence", EvidenceHandler, args),
        (job + r"/alerts", AlertsHandler, args),
        (job + r"/script", ScriptHandler, args),
        (r"/api/pools", PoolsHandler, args),
        (r"/api/pools/down", PoolsDownHandler, args),
        (r"/api/pools/([^/]+)", PoolHandler, args),
        (r"/.*", NotFoundHandler, args),
    ])
