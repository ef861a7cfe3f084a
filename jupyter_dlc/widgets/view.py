"""`JobView`: the live view of one job under a `%%dlc` cell or `%dlc attach JOB`.

It is made of three parts, each in a module of its own:
- `job_widgets.JobWidgets`: the widget tree (header, goodput bar, banners, buttons, rank
  table, charts, log tail), what sets it from what was read, and its handlers; what each
  front end shows (the charts need BokehJS) is told there;
- `job_updater.JobUpdater`: the updater thread and the metrics stream follower it owns, and
  one refresh: what to read from the launcher, what changed, what to hand to the widgets;
- `job_html`: the HTML of each text part, pure functions of the launcher's answers;
and `followed_job.FollowedJob` holds what the view knows about the job it follows.

`JobView` puts them together and keeps the names notebooks, magics and tests use: the
widgets (`view.header`, `view.banner`, `view.charts`...) and the updater's counters.
"""

from __future__ import annotations

from .. import formatting
from .job_updater import JobUpdater, read_followed
from .job_widgets import JobWidgets
from .ranktable import RankPage


class _Part:
    """An attribute of the view that is one of its parts' attributes, read on each access:
    `view.header` is `view.ui.header`, `view.refreshes` is `view._updater.refreshes`."""

    def __init__(self, part: str, name: str = ""):
        self.part, self.name = part, name  # name: the part's, when not the view's

    def __set_name__(self, owner, name: str) -> None:
        self.name = self.name or name

    def __get__(self, view, owner=None):
        if view is None:
            return self
        return getattr(getattr(view, self.part), self.name)

    def __set__(self, view, value) -> None:
        setattr(getattr(view, self.part), self.name, value)


class JobView:
    """Live view of a launcher job. `show()` displays it and starts its updater thread;
    `refresh_now()` polls once, synchronously (tests, `%%dlc --wait`)."""

    def __init__(self, client, job_id: str, interval: float = 0.25, ended_interval: float = 1.5,
                 capacity: int = 4000, log_lines: int = 200, push_interval: float = 1.0):
        paging = RankPage()
        followed = read_followed(client, job_id, paging, capacity, log_lines)
        self.ui = JobWidgets(followed, paging, capacity)
        self._updater = JobUpdater(client, self.ui, followed, interval=interval,
                                   push_interval=push_interval, ended_interval=ended_interval,
                                   capacity=capacity, log_lines=log_lines)
        self.ui.connect(stop=self.stop, resume=self.resume, clone=self.clone, refresh=self.refresh_now,
                        read_rank_page=self._updater.read_rank_page)

    # The widgets, under the names notebooks and tests use (`charts` is replaced when the view
    # follows another job).
    widget = _Part("ui")
    header = _Part("ui")
    goodput_bar = _Part("ui")
    banner = _Part("ui")
    stop_button = _Part("ui")
    resume_steps = _Part("ui")
    resume_button = _Part("ui")
    clone_button = _Part("ui")
    action_note = _Part("ui")
    rank_bar = _Part("ui")
    rank_sort = _Part("ui")
    rank_prev = _Part("ui")
    rank_pages = _Part("ui")
    rank_next = _Part("ui")
    rank_table = _Part("ui")
    metric_select = _Part("ui")
    steps_select = _Part("ui")
    charts = _Part("ui")
    bokeh = _Part("ui")
    retention_note = _Part("ui")
    chart_note = _Part("ui")
    log_filter = _Part("ui")
    log_view = _Part("ui")
    # The updater's: its client (a new one when the launcher came back elsewhere), the
    # settings the view was made with, and its counters (tests, benchmarks/live_view.py);
    # `_push` is the stream follower while there is one (tests cut it and read its state).
    client = _Part("_updater")
    interval = _Part("_updater")
    push_interval = _Part("_updater")
    ended_interval = _Part("_updater")
    capacity = _Part("_updater")
    log_lines = _Part("_updater")
    refreshes = _Part("_updater")
    points_pushed = _Part("_updater")
    points_polled = _Part("_updater")
    band_rows = _Part("_updater")
    push_trace = _Part("_updater")
    _push = _Part("_updater", "follower")

    @property
    def job_id(self) -> str:
        return self._updater.followed.job_id

    @property
    def job(self) -> dict | None:
        return self._updater.followed.job

    @property
    def rank_page(self) -> int:
        return self.ui.paging.page

    @property
    def rank_order(self) -> str:
        return self.ui.paging.order

    # -- public ---------------------------------------------------------------------------
    def show(self) -> "JobView":
        from IPython.display import display

        bundle = self.widget._repr_mimebundle_()
        # what a front end without widgets (a terminal, nbconvert to text) shows instead
        job = self.job
        bundle["text/plain"] = formatting.status_line(job) if job else f"{self.job_id}: submitted"
        display(bundle, raw=True)
        self.start()
        return self

    def _ipython_display_(self) -> None:
        self.show()

    def start(self) -> None:
        """Start the updater thread; it adopts the parent of the cell running now."""
        self._updater.start()

    def close(self) -> None:
        """Stop updating (the widgets stay as they are)."""
        self._updater.stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the updater thread to finish (the job ended); True when it has."""
        return self._updater.join(timeout)

    def refresh_now(self) -> dict | None:
        """Poll the launcher once and update every part; returns the job (None when the
        launcher cannot be reached or the job is gone)."""
        return self._updater.refresh_now()

    def stop(self, grace: float | None = None) -> dict:
        job = self.client.stop(self.job_id, grace)
        self._updater.kick()
        return job

    def resume(self, step: int | None = None) -> dict:
        job = self.client.resume(self.job_id, step)
        self._updater.kick()
        return job

    def clone(self) -> dict:
        """Submit the same spec as a new job, and follow that job from now on."""
        old = self.job_id
        job = self.client.clone(old)
        self.follow(job["id"], note=f"clone of {old}")
        return job

    def follow(self, job_id: str, note: str = "") -> None:
        """Show another job (a clone) in this view, from its beginning."""
        self._updater.follow(job_id, note)
