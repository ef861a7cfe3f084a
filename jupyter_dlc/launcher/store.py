"""The launcher's SQLite store (WAL): jobs, attempts, ranks, events, metrics, checkpoints.

Metric points are stored in chunks, a row per request (a rank's report or a node's batch),
kind and device, not a row per point (metric_chunks.py says what a chunk holds and why);
readers still get one dict per point, each with a seq that `since` cursors page by.

One connection per thread (the HTTP loop and the supervisor each have their own); WAL lets
readers go on while a writer commits. Every state change goes through `transition`, which
writes the event with its reason in the same transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .. import layout, wirejson
from ..spec import branch_parent, spec_engine
from ..states import ACTIVE_STATES, TERMINAL_STATES  # noqa: F401 (supervisor imports them here)
from . import metric_chunks
from .storage import DiskGuard, is_disk_full

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    spec TEXT NOT NULL, token TEXT NOT NULL, job_dir TEXT NOT NULL,
    created REAL NOT NULL, started REAL, ended REAL, reason TEXT,
    last_step INTEGER, last_loss REAL, resume_step INTEGER, stop_requested REAL,
    alert_state TEXT, alert_summary TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL,
    started REAL, ended REAL, reason TEXT, outcome TEXT, resume_path TEXT, port INTEGER,
    handle TEXT, failure TEXT, restarts INTEGER NOT NULL DEFAULT 0, intent TEXT,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node INTEGER, local_rank INTEGER, pid INTEGER, state TEXT NOT NULL,
    exit_code INTEGER, last_step INTEGER, last_progress REAL, last_heartbeat REAL,
    PRIMARY KEY (job_id, attempt, rank)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, t REAL NOT NULL,
    attempt INTEGER, type TEXT NOT NULL, state TEXT, reason TEXT, data TEXT
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS metric_retention (
    job_id TEXT PRIMARY KEY, bucket REAL NOT NULL, keep_last INTEGER NOT NULL,
    recent_steps INTEGER NOT NULL, downsampled_until REAL, dropped INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    job_id TEXT NOT NULL, step INTEGER NOT NULL, path TEXT NOT NULL, time REAL,
    size INTEGER, world_size INTEGER, attempt INTEGER, seconds REAL,
    PRIMARY KEY (job_id, step)
);
""" + metric_chunks.SCHEMA


# (table, column, type) added after the first schema: a store opened on an older data dir
# gains them (Store.__init__). attempts.intent: what the supervisor is about to submit
# (the engine job's name, tries so far), stored before the submit (supervisor._submit).
ADDED_COLUMNS = (("attempts", "intent", "TEXT"), ("jobs", "alert_summary", "TEXT"),
                 ("metric_chunks", "lasts", "TEXT"))


_JOB_COLUMNS = ("id, name, state, attempt, spec, token, job_dir, created, started, ended, reason,"
                " last_step, last_loss, resume_step, stop_requested, alert_summary")
_JOB_SUMMARY = ("id", "name", "state", "attempt", "created", "started", "ended", "reason",
                "last_step", "last_loss")


# The state an ended attempt keeps, from its outcome (SQL over the attempts row).
_ATTEMPT_END = ("CASE outcome WHEN 'succeeded' THEN 'SUCCEEDED' WHEN 'preempted' THEN 'STOPPED'"
                " WHEN 'stopped' THEN 'STOPPED' ELSE 'FAILED' END")


def token_hash(token: str) -> str:
    """What the store keeps of a job token: a leaked database grants nothing."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


# The rank table's orders (a view's sort; the panel's labextension/src/views.ts the same):
# slowest step first and oldest heartbeat first count "none yet" as lowest (SQLite sorts NULL first).
RANK_ORDERS = {"rank": "node, rank", "step": "last_step, rank", "heartbeat": "last_heartbeat, rank"}


def _add_attempt_checkpoint_dir(db: sqlite3.Connection) -> None:
    """`attempts.checkpoint_dir`: the directory the engine resolved for the attempt when it
    started (its `checkpoint_dir(...)`), read by the checkpoints route, the resume action and
    the supervisor. Added to data dirs from before it; their attempts keep NULL, for which
    the engine is asked again (Supervisor.checkpoint_dir)."""
    if "checkpoint_dir" not in {row[1] for row in db.execute("PRAGMA table_info(attempts)")}:
        db.execute("ALTER TABLE attempts ADD COLUMN checkpoint_dir TEXT")


class Store:
    def __init__(self, path: str, guard: DiskGuard | None = None):
        self.path = path
        self.guard = guard
        self._local = threading.local()
        # Bumped by every committed write, from any thread: lets readers skip unchanged polls.
        self.version = 0
        # The goodput ledger (goodput.Ledger) the launcher sets: summaries then carry the
        # job's goodput and progress. None elsewhere (the supervisor's tests, the ingest worker).
        self.ledger: Any = None
        self.db.executescript(SCHEMA)
        # Columns added since a data dir was first written (CREATE TABLE IF NOT EXISTS leaves
        # an existing table as it was): each added empty, nothing else touched.
        with self.tx() as db:
            for table, column, kind in ADDED_COLUMNS:
                have = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        # Data dirs written before chunks: their one-row-per-point metrics become chunks.
        with self.tx() as db:
            metric_chunks.migrate_rows(db)
        # Data dirs written before an ended attempt took its outcome's state: a restarted
        # attempt read RESTARTING for ever after.
        with self.tx() as db:
            db.execute(f"UPDATE attempts SET state = {_ATTEMPT_END} WHERE state = 'RESTARTING' AND"
                       " attempt < (SELECT attempt FROM jobs WHERE jobs.id = attempts.job_id)")
        with self.tx() as db:
            _add_attempt_checkpoint_dir(db)
        # Data dirs written before tokens were hashed: hash what is stored in clear.
        with self.tx() as db:
            for row in db.execute("SELECT id, token FROM jobs WHERE token NOT LIKE 'sha256:%'").fetchall():
                db.execute("UPDATE jobs SET token = ? WHERE id = ?", (token_hash(row["token"]), row["id"]))

    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                   check_same_thread=True)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def tx(self):
        store = self

        class _Tx:
            def __enter__(self):
                store.db.execute("BEGIN IMMEDIATE")
                return store.db

            def __exit__(self, kind, error, _tb):
                if not kind:
                    try:
                        store.db.execute("COMMIT")
                        store.version += 1
                        return False
                    except sqlite3.OperationalError as failed:
                        store._rollback()
                        store._failed(failed)
                        raise
                store._rollback()
                store._failed(error)
                return False

        return _Tx()

    def _rollback(self) -> None:
        # After some errors (a full disk among them) SQLite has rolled back by itself.
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def _failed(self, error: BaseException | None) -> None:
        if self.guard is not None and error is not None and is_disk_full(error):
            # The next try of what failed finds the reserve's space; remembered per thread,
            # for whoever decides what a failure that freed nothing means (write_verdict).
            self._local.freed = self.guard.on_full()

    def spent(self, error: BaseException) -> bool:
        """Whether `error`, this thread's last failed write, was for want of space that the
        reserve could not give any more: the store cannot write at all now."""
        return self.guard is not None and is_disk_full(error) and \
            not getattr(self._local, "freed", False)

    def write_verdict(self, write: Callable[[], T]) -> T:
        """A write that ends or stops a job, on a disk that may be full: when it fails for
        want of space and its failure freed nothing (the reserve was spent), the last
        reserve is given up for it, and it is tried once more."""
        try:
            return write()
        except sqlite3.OperationalError as error:
            if not is_disk_full(error) or self.guard is None or \
                    not (getattr(self._local, "freed", False) or self.guard.last_resort()):
                raise
        return write()

    @property
    def storage_problem(self) -> str | None:
        return self.guard.message if self.guard is not None else None

    # -- jobs ---------------------------------------------------------------------------
    def insert_job(self, job_id: str, name: str, spec: dict, token: str, job_dir: str) -> None:
        now = time.time()
        with self.tx() as db:
            db.execute(
                "INSERT INTO jobs (id, name, state, attempt, spec, token, job_dir, created)"
                " VALUES (?, ?, 'QUEUED', 1, ?, ?, ?, ?)",
                (job_id, name, json.dumps(spec), token_hash(token), job_dir, now))
            db.execute("INSERT INTO attempts (job_id, attempt, state) VALUES (?, 1, 'QUEUED')", (job_id,))
            self._event(db, job_id, 1, "state", "QUEUED", "submitted", None)

    def set_job_token(self, job_id: str, token: str) -> None:
        self.update_job(job_id, token=token_hash(token))

    @staticmethod
    def token_matches(row: sqlite3.Row, token: str) -> bool:
        """Whether `token` is the job's current one (the store holds only its hash)."""
        return hmac.compare_digest(token_hash(token), row["token"])

    def job_row(self, job_id: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()

    @staticmethod
    def alert_summary(row: sqlite3.Row) -> dict:
        """What the views read of a job's alerting: {"alerts": open episodes, "stragglers":
        who is named}. Saved beside the whole alert state (alerting.py), which a view never
        reads: with 4,096 ranks that state is about 350 KB, and parsing it for each detail
        read was one more hold of the GIL kept from the loop answering reports. A data dir written
        before the summary has only the state: read from it then."""
        text = row["alert_summary"] if "alert_summary" in row.keys() else None
        if text is None and "alert_state" in row.keys() and row["alert_state"]:
            text = row["alert_state"]
        state = wirejson.loads(text) if text else {}
        return {"alerts": state.get("alerts") or [], "stragglers": state.get("stragglers") or []}

    def report_row(self, job_id: str) -> sqlite3.Row | None:
        """What the report route needs of a job (id, token hash, attempt): a whole row carries
        the spec and the alert state, which grow with the world, and the route runs thousands
        of times a second."""
        return self.db.execute("SELECT id, token, attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()

    def job_rows(self, states: Iterable[str] | None = None) -> list[sqlite3.Row]:
        """Every job's row but its alert state (hundreds of KB with thousands of ranks, and
        these rows are read every tick and by every event stream): `job_row` has it all."""
        if states:
            states = tuple(states)
            marks = ",".join("?" * len(states))
            return self.db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state IN ({marks})"
                                   " ORDER BY created", states).fetchall()
        return self.db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY created").fetchall()

    def resolve_id(self, ref: str) -> str | None:
        """A job id, a unique prefix of one, or "last" (the newest job)."""
        if ref == "last":
            row = self.db.execute("SELECT id FROM jobs ORDER BY created DESC LIMIT 1").fetchone()
            return row["id"] if row else None
        row = self.db.execute("SELECT id FROM jobs WHERE id = ?", (ref,)).fetchone()
        if row:
            return row["id"]
        rows = self.db.execute("SELECT id FROM jobs WHERE id LIKE ? LIMIT 2",
                               (ref.replace("%", "") + "%",)).fetchall()
        return rows[0]["id"] if len(rows) == 1 else None

    def summary(self, row: sqlite3.Row) -> dict:
        spec = json.loads(row["spec"])
        out = {key: row[key] for key in _JOB_SUMMARY}
        out.update(nodes=spec.get("nodes"), nproc_per_node=spec.get("nproc_per_node"),
                   engine=spec_engine(spec), source=spec.get("source") or {},
                   job_dir=row["job_dir"], stop_requested=row["stop_requested"],
                   parent=branch_parent(spec), sweep=spec.get("sweep"), params=spec.get("params") or {},
                   storage=self.storage_problem)
        if isinstance(out["last_loss"], float) and not math.isfinite(out["last_loss"]):
            out["last_loss"] = str(out["last_loss"])
        if self.ledger is not None:
            out.update(self.ledger.summary_fields(row))
        return out

    def update_job(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        cols = ", ".join(f"{key} = ?" for key in fields)
        with self.tx() as db:
            db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def transition(self, job_id: str, state: str, reason: str, data: dict | None = None,
                   expect: str | Iterable[str] | None = None, **fields: Any) -> bool:
        """Move a job (and its current attempt) to `state`, recording why, if it is still in
        one of the `expect`ed states; returns whether it moved.

        Compare-and-set: the HTTP thread (stop) and the supervisor thread (start, end of an
        attempt) decide on what they read a moment ago, and the loser of a race must not
        overwrite the winner. Without `expect`, any active state may move. A terminal state
        is never left here: only `new_attempt` (resume, restart) does that.
        """
        allowed = ACTIVE_STATES if expect is None else (
            (expect,) if isinstance(expect, str) else tuple(expect))
        now = time.time()
        with self.tx() as db:
            row = db.execute("SELECT attempt, state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row["state"] not in allowed or row["state"] in TERMINAL_STATES:
                return False
            attempt = row["attempt"]
            fields = dict(fields, state=state, reason=reason)
            if state == "RUNNING":
                fields.setdefault("started", now)
            if state in TERMINAL_STATES:
                fields.setdefault("ended", now)
            cols = ", ".join(f"{key} = ?" for key in fields)
            db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))
            db.execute("UPDATE attempts SET state = ? WHERE job_id = ? AND attempt = ?",
                       (state, job_id, attempt))
            self._event(db, job_id, attempt, "state", state, reason, data)
        return True

    def state(self, job_id: str) -> str | None:
        row = self.db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row["state"] if row else None

    def new_attempt(self, job_id: str, reason: str, resume_step: int | None = None,
                    expect: Iterable[str] = TERMINAL_STATES) -> int | None:
        """Start attempt + 1 (QUEUED) if the job is in an `expect`ed state: an ended job
        (resume) or RESTARTING (the supervisor's restart). None if it was not."""
        with self.tx() as db:
            row = db.execute("SELECT attempt, state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row["state"] not in tuple(expect):
                return None
            attempt = row["attempt"] + 1
            # The attempt left behind reads as it ended (a restarted one is not RESTARTING).
            db.execute(f"UPDATE attempts SET state = {_ATTEMPT_END} WHERE job_id = ? AND attempt = ?"
                       f" AND state IN ({', '.join('?' * len(ACTIVE_STATES))})",
                       (job_id, row["attempt"], *ACTIVE_STATES))
            db.execute("INSERT INTO attempts (job_id, attempt, state) VALUES (?, ?, 'QUEUED')",
                       (job_id, attempt))
            db.execute("UPDATE jobs SET attempt = ?, state = 'QUEUED', reason = ?, ended = NULL,"
                       " stop_requested = NULL, resume_step = ? WHERE id = ?",
                       (attempt, reason, resume_step, job_id))
            self._event(db, job_id, attempt, "state", "QUEUED", reason, None)
        return attempt

    def delete_job(self, job_id: str) -> None:
        with self.tx() as db:
            for table in ("jobs", "attempts", "ranks", "events", "metric_chunks", "checkpoints",
                          "metric_retention"):
                key = "id" if table == "jobs" else "job_id"
                db.execute(f"DELETE FROM {table} WHERE {key} = ?", (job_id,))

    # -- attempts and ranks -------------------------------------------------------------
    def attempt_row(self, job_id: str, attempt: int) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM attempts WHERE job_id = ? AND attempt = ?",
                               (job_id, attempt)).fetchone()

    def attempt_rows(self, job_id: str) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt",
                               (job_id,)).fetchall()

    def update_attempt(self, job_id: str, attempt: int, **fields: Any) -> None:
        cols = ", ".join(f"{key} = ?" for key in fields)
        with self.tx() as db:
            db.execute(f"UPDATE attempts SET {cols} WHERE job_id = ? AND attempt = ?",
                       (*fields.values(), job_id, attempt))

    def init_ranks(self, job_id: str, attempt: int, nodes: int, nproc: int) -> None:
        with self.tx() as db:
            for rank in range(nodes * nproc):
                db.execute("INSERT OR REPLACE INTO ranks (job_id, attempt, rank, node, local_rank, state)"
                           " VALUES (?, ?, ?, ?, ?, 'starting')",
                           (job_id, attempt, rank, rank // nproc, rank % nproc))

    def rank_page(self, job_id: str, attempt: int, order: str, page: int,
                  size: int) -> tuple[list[sqlite3.Row], int, int, dict[str, int]]:
        """One page of an attempt's ranks in RANK_ORDERS[order]: (its rows, the page clamped to
        those that exist, the rank count, the count of ranks in each state). Sorted in SQL:
        a view of 4,096 ranks reads 50 rows, not 4,096 (790 KB and 30-40 ms of CPU a read)."""
        states = {state: count for state, count in self.db.execute(
            "SELECT state, count(*) FROM ranks WHERE job_id = ? AND attempt = ? GROUP BY state",
            (job_id, attempt))}
        total = sum(states.values())
        page = min(page, max(0, -(-total // size) - 1))
        rows = self.db.execute(f"SELECT * FROM ranks WHERE job_id = ? AND attempt = ?"
                               f" ORDER BY {RANK_ORDERS[order]} LIMIT ? OFFSET ?",
                               (job_id, attempt, size, page * size)).fetchall()
        return rows, page, total, states

    def rank_count(self, job_id: str, attempt: int) -> int:
        return self.db.execute("SELECT count(*) FROM ranks WHERE job_id = ? AND attempt = ?",
                               (job_id, attempt)).fetchone()[0]

    def rank_rows(self, job_id: str, attempt: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM ranks WHERE job_id = ? AND attempt = ? ORDER BY rank",
                               (job_id, attempt)).fetchall()

    def rank_states(self, job_id: str, attempt: int) -> dict[int, tuple[Any, Any, Any]]:
        """{rank: (pid, exit_code, state)} of an attempt: what the engine's word is compared
        with every tick, as plain tuples (a Row of every column per rank was most of a
        4,096-rank tick)."""
        cursor = self.db.execute("SELECT rank, pid, exit_code, state FROM ranks WHERE job_id = ?"
                                 " AND attempt = ?", (job_id, attempt))
        cursor.row_factory = None
        return {rank: (pid, code, state) for rank, pid, code, state in cursor}

    def liveness_of(self, job_id: str, attempt: int) -> tuple[float | None, float | None]:
        """(the oldest last_heartbeat of a rank that has not exited, the oldest last_progress)
        of an attempt, each None where no rank has one; judged without a row per rank."""
        return self.db.execute(
            "SELECT MIN(CASE WHEN exit_code IS NULL THEN NULLIF(last_heartbeat, 0) END),"
            " MIN(NULLIF(last_progress, 0)) FROM ranks WHERE job_id = ? AND attempt = ?",
            (job_id, attempt)).fetchone()

    def first_silent_rank(self, job_id: str, attempt: int, before: float) -> sqlite3.Row | None:
        """The lowest rank that has not exited and last heartbeated before `before`."""
        return self.db.execute(
            "SELECT * FROM ranks WHERE job_id = ? AND attempt = ? AND exit_code IS NULL AND"
            " last_heartbeat AND last_heartbeat < ? ORDER BY rank LIMIT 1",
            (job_id, attempt, before)).fetchone()

    def progress_of(self, job_id: str, attempt: int) -> tuple[int, float | None]:
        """(ranks, newest last_progress) of an attempt, without a row per rank."""
        count, newest = self.db.execute(
            "SELECT COUNT(*), MAX(last_progress) FROM ranks WHERE job_id = ? AND attempt = ?",
            (job_id, attempt)).fetchone()
        return count, newest

    def update_rank(self, job_id: str, attempt: int, rank: int, **fields: Any) -> None:
        cols = ", ".join(f"{key} = ?" for key in fields)
        with self.tx() as db:
            db.execute(f"UPDATE ranks SET {cols} WHERE job_id = ? AND attempt = ? AND rank = ?",
                       (*fields.values(), job_id, attempt, rank))

    # -- events -------------------------------------------------------------------------
    def _event(self, db, job_id, attempt, type_, state, reason, data) -> None:
        db.execute("INSERT INTO events (job_id, t, attempt, type, state, reason, data)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (job_id, time.time(), attempt, type_, state, reason,
                    json.dumps(data) if data is not None else None))

    def add_event(self, job_id: str, attempt: int, type_: str, reason: str,
                  data: dict | None = None, state: str | None = None) -> None:
        with self.tx() as db:
            self._event(db, job_id, attempt, type_, state, reason, data)

    def events(self, job_id: str, since: int = 0, types: Iterable[str] | None = None) -> list[dict]:
        types = tuple(types or ())
        where = f" AND type IN ({', '.join('?' * len(types))})" if types else ""
        rows = self.db.execute(f"SELECT * FROM events WHERE job_id = ? AND seq > ?{where} ORDER BY seq",
                               (job_id, since, *types)).fetchall()
        out = []
        for row in rows:
            event = dict(row)
            event["data"] = json.loads(row["data"]) if row["data"] else None
            out.append(event)
        return out

    def last_event_seq(self) -> int:
        """The newest event's seq, of any job (0 when there is none)."""
        return self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

    def event_rows_since(self, since: int, types: Iterable[str]) -> list[dict]:
        """Every job's events of these types after seq `since`, in order, as stored (`data`
        the JSON text): what the jobs stream forwards as it is."""
        types = tuple(types)
        return [dict(row) for row in self.db.execute(
            f"SELECT * FROM events WHERE seq > ? AND type IN ({', '.join('?' * len(types))}) ORDER BY seq",
            (since, *types)).fetchall()]

    def record_events(self, job_id: str, attempt: int) -> list[dict]:
        """The rank records (start, end, first error) the attempt's ranks reported, in order."""
        rows = self.db.execute(
            "SELECT data FROM events WHERE job_id = ? AND attempt = ? AND type IN"
            f" ({', '.join('?' * len(layout.RECORD_EVENTS))}) ORDER BY seq",
            (job_id, attempt, *layout.RECORD_EVENTS)).fetchall()
        return [json.loads(row["data"]) for row in rows if row["data"]]

    # -- reports from ranks -------------------------------------------------------------
    def record_report(self, job_id: str, attempt: int, report: dict) -> dict:
        """Store one rank report; returns what changed, for the supervisor and the stream."""
        return self.record_reports([(job_id, attempt, [report])])[0]

    def record_reports(self, items: list[tuple[str, int, list[dict]]]) -> list[dict]:
        """Store the rank reports of several requests (job id, attempt, reports) in one
        transaction (launcher/ingest.py); returns, per request, what changed.

        Thousands of ranks report several times a second: the rows of every report are
        gathered first and written with one statement per kind of change, and the metric
        points of a request as one chunk (metric_chunks.py), not a row each."""
        now = time.time()
        full = bool(self.storage_problem)
        rows: list[tuple] = []
        beats: list[tuple] = []
        steps: list[tuple] = []
        job_steps: dict[tuple[str, int], int] = {}
        job_losses: dict[str, float | None] = {}
        events: list[tuple[str, int, int, dict]] = []
        out = []
        for job_id, attempt, reports in items:
            changed = {"steps": False, "events": False}
            chunks = metric_chunks.ChunkBuilder(job_id, attempt, now)
            for report in reports:
                rank = int(report.get("rank", 0))
                # The disk is full: keep the heartbeat and events (small, and what keeps a
                # healthy job from being judged dead), not the metrics.
                last_step, loss = (None, None) if full else chunks.add(rank, report)
                pid = report.get("pid")
                # A report of only a rank's own records (sent by its bootstrap, or a node's
                # preflight) is not a heartbeat: a script without the runtime would then be
                # judged as silent.
                own = report.get("events") or []
                if not own or report.get("metrics") or report.get("system") or \
                        any(event.get("type") not in layout.RECORD_EVENTS for event in own):
                    beats.append((now, int(pid) if pid else None, job_id, attempt, rank))
                if last_step is not None:
                    changed["steps"] = True
                    steps.append((last_step, now, job_id, attempt, rank, last_step))
                    key = (job_id, attempt)
                    job_steps[key] = max(last_step, job_steps.get(key, last_step))
                if loss is not None and rank == 0:
                    job_losses[job_id] = loss[0]
                for event in report.get("events") or []:
                    changed["events"] = True
                    events.append((job_id, attempt, rank, event))
            rows += chunks.rows()
            out.append(changed)
        with self.tx() as db:
            if rows:
                db.executemany(metric_chunks.INSERT, rows)
            db.executemany("UPDATE ranks SET last_heartbeat = ?, state = 'running', pid = COALESCE(?, pid)"
                           " WHERE job_id = ? AND attempt = ? AND rank = ? AND exit_code IS NULL", beats)
            db.executemany("UPDATE ranks SET last_step = ?, last_progress = ? WHERE job_id = ?"
                           " AND attempt = ? AND rank = ? AND (last_step IS NULL OR last_step < ?)", steps)
            for (job_id, attempt), last_step in job_steps.items():
                db.execute("UPDATE jobs SET last_step = ? WHERE id = ? AND"
                           " (last_step IS NULL OR last_step < ? OR attempt = ?)",
                           (last_step, job_id, last_step, attempt))
            for job_id, job_loss in job_losses.items():
                db.execute("UPDATE jobs SET last_loss = ? WHERE id = ?", (job_loss, job_id))
            for job_id, attempt, rank, event in events:
                self._report_event(db, job_id, attempt, rank, event, now)
        return out

    def _report_event(self, db, job_id: str, attempt: int, rank: int, event: dict, now: float) -> None:
        kind = str(event.get("type", "event"))
        if kind == "checkpoint":
            db.execute("INSERT OR REPLACE INTO checkpoints (job_id, step, path, time, size,"
                       " world_size, attempt, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (job_id, event.get("step"), event.get("path"), event.get("t", now),
                        event.get("size"), event.get("world_size"), attempt,
                        event.get("seconds")))
        reason = event.get("message") or f"rank {rank}: {kind}" + (
            f" at step {event['step']}" if event.get("step") is not None else "")
        self._event(db, job_id, attempt, kind, None, reason, dict(event, rank=rank))

    def newest_metric_seq(self, job_id: str, db: sqlite3.Connection | None = None) -> int | None:
        """The seq of the job's newest metric point; None while it has none."""
        row = (db or self.db).execute("SELECT seq, top FROM metric_chunks WHERE job_id = ?"
                                      " ORDER BY seq DESC LIMIT 1", (job_id,)).fetchone()
        return row[0] * metric_chunks.CHUNK + row[1] if row else None

    def metric_seq_writes_back(self, job_id: str, until: int, writes: int) -> int:
        """The `since` cursor from which a read gets the job's last `writes` stored writes up
        to the point seq `until` (a write is a chunk; chunk seqs are shared by every job, so
        only the job's own are counted)."""
        row = self.db.execute("SELECT seq FROM metric_chunks WHERE job_id = ? AND seq <= ?"
                              " ORDER BY seq DESC LIMIT 1 OFFSET ?",
                              (job_id, until // metric_chunks.CHUNK, max(0, writes))).fetchone()
        return row[0] * metric_chunks.CHUNK + metric_chunks.CHUNK - 1 if row else 0

    def newest_train_times(self, job_id: str, since: int) -> dict[int, float]:
        """{attempt: the time of its newest train point} among the points after `since`, from
        the chunks' own column (no point is decoded)."""
        rows = self.db.execute("SELECT attempt, max(t_last) FROM metric_chunks WHERE job_id = ?"
                               " AND seq >= ? AND kind = 'train' AND seq * ? + top > ?"
                               " GROUP BY attempt", (job_id, since // metric_chunks.CHUNK,
                                                     metric_chunks.CHUNK, since))
        return {attempt or 0: t for attempt, t in rows if t is not None}

    def metric_points(self, job_id: str, since: int, names: Iterable[str],
                      latest: Iterable[str] = ()) -> tuple[int, list[tuple]]:
        """(newest seq, [(seq, name, t, rank, value, device)...]) of the points after `since`
        with one of `names`, and of `latest` names at least each rank's last of every write
        (metric_chunks.named_points): what alert rules read, without building a dict per
        point of the metrics no rule names (chunks without those names are skipped in SQL)."""
        newest = self.newest_metric_seq(job_id)
        names, latest = tuple(names), tuple(latest)
        if newest is None or newest <= since or not (names or latest):
            return max(since, newest or 0), []
        where, params = metric_chunks.names_filter(names + latest)
        cursor = self.db.execute(
            f"SELECT seq, device, names, top, data, lasts FROM metric_chunks WHERE job_id = ? AND seq >= ?"
            f" AND seq <= ? AND {where} ORDER BY seq",
            (job_id, since // metric_chunks.CHUNK, newest // metric_chunks.CHUNK, *params))
        cursor.row_factory = None
        return newest, metric_chunks.named_points(cursor, since, newest, names, latest)

    def metrics(self, job_id: str, since: int = 0, limit: int = 20000) -> list[dict]:
        """Up to `limit` points after `since`, in seq order (a page may end inside a chunk)."""
        return self.metric_page(job_id, since, limit)[0]

    def metric_page(self, job_id: str, since: int = 0, limit: int = 20000,
                    fold: Any = None, rank: int | None = None) -> tuple[list[dict], int]:
        """The points of the next `limit` after `since` (train points a `fold` takes go to it
        instead, bands.py) and the seq of the last one read. With `rank`, only the chunks
        that hold that rank's points are read (others' points of those chunks come too)."""
        where, params = metric_chunks.rank_filter(rank) if rank is not None else ("1", [])
        cursor = self.db.execute(f"SELECT {metric_chunks.POINT_COLUMNS} FROM metric_chunks"
                                 f" WHERE job_id = ? AND seq >= ? AND {where} ORDER BY seq",
                                 (job_id, since // metric_chunks.CHUNK, *params))
        cursor.row_factory = None  # plain tuples: a view reads many thousands of points
        points: list[dict] = []
        last = since
        if limit > 0:
            last = metric_chunks.read_points(points, cursor, since, limit, fold)
        cursor.close()
        return points, last

    def retention_state(self, job_id: str) -> dict | None:
        """How far retention.py downsampled this job's metrics; None while it has not."""
        row = self.db.execute("SELECT * FROM metric_retention WHERE job_id = ?", (job_id,)).fetchone()
        return dict(row) if row else None

    def set_retention_state(self, job_id: str, state: dict, db: sqlite3.Connection | None = None) -> None:
        """In the caller's transaction `db`, else in one of its own."""
        if db is None:
            with self.tx() as db:
                self.set_retention_state(job_id, state, db)
            return
        db.execute("INSERT OR REPLACE INTO metric_retention (job_id, bucket, keep_last,"
                   " recent_steps, downsampled_until, dropped) VALUES (?, ?, ?, ?, ?, ?)",
                   (job_id, state["bucket"], state["keep_last"], state["recent_steps"],
                    state["downsampled_until"], state["dropped"]))

    def metric_window(self, job_id: str, t_from: float) -> list[dict]:
        """The job's points logged at `t_from` or later, in seq order."""
        cursor = self.db.execute(f"SELECT {metric_chunks.POINT_COLUMNS} FROM metric_chunks"
                                 " WHERE job_id = ? AND t_last >= ? ORDER BY seq", (job_id, t_from))
        cursor.row_factory = None
        points: list[dict] = []
        metric_chunks.read_points(points, cursor, 0, 1 << 62)
        return [point for point in points if point["t"] >= t_from]

    def checkpoints(self, job_id: str) -> list[dict]:
        rows = self.db.execute("SELECT * FROM checkpoints WHERE job_id = ? ORDER BY step",
                               (job_id,)).fetchall()
        return [dict(row) for row in rows]
