"""`FollowedJob`: what the job view knows about the job it follows, and how the launcher's
answers (metric points and bands, log lines, events) change it. No widget and no client:
the updater (job_updater.py) reads, this keeps, the widgets (job_widgets.py) show.

A view that follows a clone starts a new `FollowedJob`; whoever holds the old one checks
`followed is not view's followed` before showing what it read, so an answer about the old
job never lands on the new one's widgets.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .series import SystemData, TrainData


class MetricsAdded(NamedTuple):
    """What one metrics answer added: `values` (points, a band row counting its values),
    `band_rows`, and whether an outlier rank appeared (the stream must ask for its points)."""
    values: int
    band_rows: int
    new_outliers: bool


class FollowedJob:
    """The followed job's cursors (metrics and events seq, log cursor), its chart data, log
    tail, active alerts, evidence, diagnoses, checkpoints, goodput ledger and last detail."""

    def __init__(self, job_id: str, world_size: int, capacity: int, log_lines: int):
        self.job_id = job_id
        self.world_size = world_size
        self.capacity = capacity
        self.metrics_seq = 0
        self.events_seq = 0
        self.log_cursor: str | None = None
        self.log_attempt: int | None = None
        self.log_counter = 0
        self.logs_shown: int | None = None  # log_counter when the log tail was last shown
        self.logs_all: deque = deque(maxlen=log_lines)
        self.logs_by_rank: dict[int, deque] = {}
        self.log_lines = log_lines
        self.train = TrainData(world_size, capacity)
        self.system = SystemData(capacity)
        self.alerts: dict[str, dict] = {}
        self.diagnoses: list[dict] = []
        self.evidence: list[dict] = []  # `evidence` events: what was kept before a kill
        self.diagnosis_count = -1
        self.checkpoints: list[dict] | None = None
        self.checkpoint_key: tuple | None = None
        self.job: dict | None = None
        self.gone: str | None = None
        self.finalised: tuple | None = None  # (attempt, metrics seq) of the last full bokeh re-send
        # A branch's parent up to the branch step: {metric: [(step, value)]} of its rank 0,
        # read once and drawn muted under the branch's own lines; {} when there is none.
        self.parent_points: dict[str, list] | None = None
        self.goodput: dict | None = None   # the ledger as last read, and when
        self.goodput_read: tuple[float, tuple | None] = (0.0, None)
        self.note = ""

    def band(self) -> list[int] | None:
        """What a metrics read asks for (bands.py): past 8 ranks, train points folded per
        step but for the outlier ranks' lines; else None, every point."""
        return None if self.train.by_rank else list(self.train.outliers)

    def set_world(self, world: int) -> bool:
        """The world size decides the chart's lines; it is known once the launcher answered.
        True when it changed the train data (only before any point arrived)."""
        if world == self.train.world_size or self.metrics_seq != 0:
            return False
        self.world_size = world
        self.train = TrainData(world, self.capacity)
        return True

    def add_metrics(self, answer: dict, since: int) -> MetricsAdded:
        """Add a metrics answer's points not seen yet (a poll and the stream may both bring
        one) and its band rows, when it starts where the view is (rows have no seq: an
        answer that overlaps what the view has would add some twice); moves the seq."""
        added = rows = 0
        outliers = len(self.train.outliers)
        for point in answer.get("points") or ():
            if int(point.get("seq") or 0) <= self.metrics_seq:
                continue
            if point.get("kind") == "system":
                self.system.add(point)
            else:
                self.train.add(point)
            added += 1
        if since == self.metrics_seq:
            for row in answer.get("bands") or ():
                self.train.add_band(row)
                added += row["n"]
                rows += 1
        self.metrics_seq = max(self.metrics_seq, int(answer.get("last_seq") or 0))
        return MetricsAdded(added, rows, len(self.train.outliers) != outliers)

    def add_log(self, rank: int | None, text: str) -> None:
        self.log_counter += 1
        item = (self.log_counter, rank, text)
        self.logs_all.append(item)
        if rank is not None:
            self.logs_by_rank.setdefault(rank, deque(maxlen=self.log_lines)).append(item)

    def add_logs(self, answer: dict) -> None:
        """A logs answer: its lines, after a separator when a new attempt began, and its cursor."""
        attempt = answer.get("attempt")
        if attempt is not None and attempt != self.log_attempt:
            if self.log_attempt is not None or (attempt or 1) > 1:
                self.add_log(None, f"--- attempt {attempt} ---")
            self.log_attempt = attempt
        for line in answer.get("lines") or []:
            self.add_log(line.get("rank"), line.get("text", ""))
        self.log_cursor = answer.get("cursor") or self.log_cursor

    def logs_of(self, rank: int | None) -> list[tuple]:
        """The log tail the filter shows: every rank's (`rank` None or < 0), or one rank's with
        the attempt separators, which belong to every filter."""
        if rank is None or rank < 0:
            return list(self.logs_all)
        items = list(self.logs_by_rank.get(rank, ()))
        return sorted(items + [i for i in self.logs_all if i[1] is None])[-self.log_lines:]

    def add_events(self, events: list) -> None:
        """Events since the last seq: alerts raised and resolved, evidence kept; a diagnosis
        or a checkpoint makes the next refresh read those again."""
        for event in events:
            self.events_seq = max(self.events_seq, int(event.get("seq") or 0))
            data = event.get("data") or {}
            kind = event.get("type")
            if kind in ("alert", "alert_resolved"):
                key = str(data.get("rule") or data.get("condition") or event.get("reason"))
                if kind == "alert":
                    self.alerts[key] = event
                else:
                    self.alerts.pop(key, None)
            elif kind == "diagnosis":
                self.diagnosis_count = -1  # fetch it
            elif kind == "evidence":
                self.evidence.append(event)
            elif kind == "checkpoint":
                self.checkpoint_key = None
