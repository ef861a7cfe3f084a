"""The live view of a sweep (`%%dlc --sweep ...`): its trials as a sortable table (state,
parameters, step, last and best of a metric) over one chart with every trial's curve.

One updater thread, like a job view's: each second it reads the job list once and, for each
trial, only the metric points after the seq it already has (sweeps.metric_points), then
redraws the table and, when a curve grew, re-sends the chart's document (a sweep's chart is
small: one line a trial). It stops after one refresh with every trial ended. Everything shown
came from jobs, so it is escaped as text.
"""

from __future__ import annotations

import html
import math
import threading

from bokeh.models import ColumnDataSource, HoverTool, Legend
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from .. import formatting, sweeps
from ..client import TERMINAL, LauncherError
from .charts import HEIGHT, JobChartsModel
from .kernelthread import adopt_parent, capture_parent

SORTS = {"trial": "trial", "best": "best (lowest first)", "last": "last (lowest first)", "state": "state"}
_STATE_ORDER = {"RUNNING": 0, "STARTING": 1, "PREFLIGHT": 2, "PENDING": 3, "QUEUED": 4,
                "RESTARTING": 5, "STOPPING": 6, "SUCCEEDED": 7, "STOPPED": 8, "FAILED": 9}


class SweepView:
    def __init__(self, client, sweep_id: str, metric: str = "loss", interval: float = 1.0):
        import ipywidgets as w

        self.client = client
        self.sweep_id = sweep_id
        self.metric = metric
        self.interval = interval
        self.trials: list[dict] = []
        self._points: dict[str, list] = {}
        self._seq: dict[str, int] = {}
        self._drawn: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.header = w.HTML(f"<b>sweep {html.escape(sweep_id)}</b>: waiting for the launcher")
        self.sort = w.Dropdown(options=[(label, key) for key, label in SORTS.items()], value="trial",
                               description="sort by")
        self.sort.observe(lambda _change: self._render_table(), names="value")
        self.table = w.HTML()
        self.bokeh = JobChartsModel(self._figure())
        self.widget = w.VBox([self.header, self.sort, self.table, self.bokeh])

    def show(self) -> SweepView:
        from IPython.display import display

        display(self.widget)
        self._kernel, self._parent = capture_parent()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"dlc-sweep-{self.sweep_id}")
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def refresh_now(self) -> list[dict]:
        """Read the launcher once and redraw; returns the trials."""
        with self._lock:
            jobs = sweeps.trial_jobs(self.client, self.sweep_id)
            grew = False
            for job in jobs:
                points, self._seq[job["id"]] = sweeps.metric_points(
                    self.client, job["id"], self.metric, self._seq.get(job["id"], 0))
                if points:
                    self._points.setdefault(job["id"], []).extend(points)
                    grew = True
            self.trials = [self._with_values(job) for job in jobs]
            self.refreshes += 1
            self._render_header()
            self._render_table()
            if grew or len(self._drawn) != len(jobs):
                self.bokeh.update_from_model(self._figure())
            return self.trials

    def _run(self) -> None:
        adopt_parent(self._kernel, self._parent)
        while not self._closed.is_set():
            try:
                trials = self.refresh_now()
            except LauncherError as error:
                self.header.value = f"<b>sweep {html.escape(self.sweep_id)}</b>: {html.escape(str(error))}"
                trials = []
            if trials and all(t["state"] in TERMINAL for t in trials):
                return  # that refresh saw every trial ended
            self._closed.wait(self.interval)

    def _with_values(self, job: dict) -> dict:
        values = self._points.get(job["id"], [])
        return dict(job, best=min((v for _, v in values), default=None),
                    last=max(values)[1] if values else None)

    def _sorted(self) -> list[dict]:
        key = self.sort.value
        if key in ("best", "last"):
            return sorted(self.trials, key=lambda t: (t[key] is None, t[key] if t[key] is not None else 0,
                                                      t["sweep"]["trial"]))
        if key == "state":
            return sorted(self.trials, key=lambda t: (_STATE_ORDER.get(t["state"], 99), t["sweep"]["trial"]))
        return list(self.trials)

    def _render_header(self) -> None:
        counts: dict[str, int] = {}
        for trial in self.trials:
            counts[trial["state"]] = counts.get(trial["state"], 0) + 1
        parallel = (self.trials[0]["sweep"].get("parallel") if self.trials else None)
        text = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()))
        self.header.value = (f'<div class="dlc-sweep-header"><b>sweep {html.escape(self.sweep_id)}</b>: '
                             f"{len(self.trials)} trials ({html.escape(text)})"
                             + (f", {parallel} at a time" if parallel else "") + "</div>")

    def _render_table(self) -> None:
        trials = self._sorted()
        names = list(dict.fromkeys(n for t in trials for n in (t.get("params") or {})))
        best = min((t["best"] for t in trials if t["best"] is not None), default=None)
        head = "".join(f"<th>{html.escape(h)}</th>" for h in
                       ("trial", "job", "state", *names, "step", f"last {self.metric}", f"best {self.metric}"))
        rows = []
        for t in trials:
            cells = [str(t["sweep"]["trial"]), t["id"], t["state"],
                     *(formatting.param_text((t.get("params") or {}).get(n)) for n in names),
                     formatting.step_cell(t), _number(t["last"]), _number(t["best"])]
            classes = "dlc-trial dlc-best" if best is not None and t["best"] == best else "dlc-trial"
            title = html.escape(t.get("reason") or "", quote=True)
            rows.append(f'<tr class="{classes}" data-trial="{t["sweep"]["trial"]}" '
                        f'data-state="{html.escape(t["state"], quote=True)}" title="{title}">'
                        + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        self.table.value = (f'<table class="dlc-sweep"><thead><tr>{head}</tr></thead>'
                            f'<tbody>{"".join(rows)}</tbody></table>')

    def _figure(self):
        fig = figure(name="dlc-sweep", width=2 * 470, height=HEIGHT, title=f"{self.metric}, every trial",
                     x_axis_label="step", y_axis_label=self.metric,
                     tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above")
        fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt", spacing=0, padding=4), "right")
        self._drawn = {}
        for i, trial in enumerate(self.trials):
            points = sorted(self._points.get(trial["id"], []))
            params = " ".join(f"{k}={formatting.param_text(v)}" for k, v in (trial.get("params") or {}).items())
            source = ColumnDataSource({"x": [p[0] for p in points], "y": [p[1] for p in points]},
                                      name=f"dlc-trial-{trial['sweep']['trial']}")
            fig.line("x", "y", source=source, line_width=2, color=Category10_10[i % len(Category10_10)],
                     legend_label=f"#{trial['sweep']['trial']} {params}"[:60])
            self._drawn[trial["id"]] = len(points)
        fig.add_tools(HoverTool(tooltips=[("step", "@x{0}"), (self.metric, "@y{0.0000}")]))
        return fig


def _number(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}"
