"""The bokeh charts of a job view: a train metric against step, utilisation against time,
and (once ranks log the step breakdown, runtime/breakdown.py) where each step goes, stacked.

One `Charts` per followed job. The layout goes into a `JobChartsModel` (a
`jupyter_bokeh.BokehModel`); the changes below (stream, data reset, a new line) of one
`JobChartsModel.batch()` become one bokeh PATCH-DOC that the widget sends over its comm.
Data comes from `series.TrainData` / `series.SystemData`, which keep
it bounded; `stream(..., rollover=capacity)` bounds the browser's copy the same way.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem, NumeralTickFormatter, Range1d
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from ..shims.bokeh_private import ignore_page_events, route_document_patches, send_patch
from .series import BREAKDOWN_NAMES, STEP_PARTS, SystemData, TrainData, label_for, step_breakdown

WIDTH, HEIGHT = 470, 270
STEPS_HEIGHT = 230
# The step chart is redrawn whole (its last 200 bars), so at most this often while a job
# runs: a page re-lays out four stacked glyphs at each redraw.
STEPS_REDRAW_SECONDS = 1.0
COMPUTE_COLOUR = "#b0bec5"
# Utilisation lines made with the charts, hidden until a node's samples claim them: a plot
# whose renderers change is laid out whole again by BokehJS (140-200 ms of the page's one
# thread on a loaded machine, which held every live point behind it up to a second when the
# first samples came; benchmarks/RESULTS.md), while a line that is shown and given its label
# is only repainted. Past the pool, lines are added as they come.
SYSTEM_LINE_POOL = 8


@ignore_page_events
@route_document_patches
class JobChartsModel(BokehModel):
    """A `jupyter_bokeh.BokehModel` whose kernel-side document the page never changes, and
    whose changes go to the page in one bokeh message per `batch()`.

    jupyter_bokeh 4.1's page sends back every change it makes or applies: each patch it
    applied (its pending events are flushed after the patch), so every `stream()` came back
    and was applied twice in the kernel; and the ranges BokehJS computes, which then sat
    in the kernel as fixed start/end, so after a full re-send the axes stopped following the
    data. Data, and everything else, only flows kernel -> page here: page events are dropped.

    jupyter_bokeh sends each change as its own PATCH-DOC (3 comm messages or more). One push
    of the view changes several lines and a title, many times a second: the comm messages,
    each relayed by the Jupyter server and parsed by the page, were where the notebook's
    logged -> drawn time went (benchmarks/HISTORY.md). Inside `with model.batch():` changes
    are collected and leave as ONE PATCH-DOC at its end, in their order. Callers hold the
    view's lock around a batch, as around every chart change, so batches never interleave.
    """

    def __init__(self, *args, **kwargs):
        self._held: list | None = None
        self.patches_sent = 0  # PATCH-DOC messages sent (tests count them)
        self.page_messages = 0  # messages the page sent back, dropped (the benchmark counts them)
        super().__init__(*args, **kwargs)

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self._held is not None:  # nested: the outer batch sends
            yield
            return
        self._held = []
        try:
            yield
        finally:
            events, self._held = self._held, None
            self._send_patches(events)

    def document_patched(self, event) -> None:
        if self._held is not None:
            self._held.append(event)
        else:
            self._send_patches([event])

    def _send_patches(self, events: list) -> None:
        # one message per run of events of one document (a view that switched to a new
        # layout mid-batch sends the old document's events first, as jupyter_bokeh would)
        start = 0
        for i in range(1, len(events) + 1):
            if i == len(events) or events[i].document is not events[start].document:
                send_patch(self, events[start:i])
                self.patches_sent += 1
                start = i


def _colour(i: int) -> str:
    return Category10_10[i % len(Category10_10)]


class Charts:
    def __init__(self, job_id: str, train: TrainData, system: SystemData, capacity: int):
        self.job_id = job_id
        self.train = train
        self.system = system
        self.capacity = capacity
        self.metric = "loss"

        self.train_fig = figure(name="dlc-train", width=WIDTH, height=HEIGHT, title="loss",
                                x_axis_label="step", y_axis_label="loss",
                                tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above")
        self.train_fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt",
                                         spacing=0, padding=4), "right")
        self.train_sources: dict = {}
        # A branch's parent (set_parent): its curve up to the branch step, muted, under the rest.
        self.parent_label: str | None = None
        self.parent_points: dict[str, list] = {}
        self.parent_source = ColumnDataSource({"x": [], "y": []}, name="dlc-train-parent")
        for key in train.keys:
            self._add_train_line(key)
        self.train_fig.add_tools(HoverTool(tooltips=[("step", "@x{0}"), ("value", "@y{0.0000}")]))

        self.sys_fig = figure(name="dlc-system", width=WIDTH, height=HEIGHT,
                              title="utilisation (waiting for samples)", x_axis_type="datetime",
                              y_axis_label="fraction", y_range=Range1d(0, 1.05),
                              tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above")
        self.sys_fig.yaxis.formatter = NumeralTickFormatter(format="0%")
        self.sys_legend = Legend(click_policy="hide", label_text_font_size="8pt", spacing=0, padding=4)
        self.sys_fig.add_layout(self.sys_legend, "right")
        self.sys_sources: dict[tuple, ColumnDataSource] = {}
        self._sys_pool = [self._pooled_system_line(i) for i in range(SYSTEM_LINE_POOL)]
        self._sys_title = ""

        self.steps_of: int | None = None  # None: the median over ranks; else that rank
        self._steps_dirty = False
        self._steps_drawn_at = float("-inf")
        self.steps_source = ColumnDataSource({"x": [], "data": [], "sync": [], "ckpt": [], "compute": []},
                                             name="dlc-step-breakdown")
        self.steps_fig = figure(name="dlc-steps", width=2 * WIDTH, height=STEPS_HEIGHT,
                                title=self._steps_title(), x_axis_label="step", y_axis_label="ms",
                                tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above")
        stack = [key for key, _, _ in STEP_PARTS] + ["compute"]
        colours = [_colour(1), _colour(3), _colour(4), COMPUTE_COLOUR]
        labels = [label for _, _, label in STEP_PARTS] + ["compute (the rest)"]
        self.steps_fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt",
                                         spacing=0, padding=4), "right")
        self.steps_fig.vbar_stack(stack, x="x", width=0.9, color=colours, source=self.steps_source,
                                  legend_label=labels)
        self.steps_fig.add_tools(HoverTool(tooltips=[("step", "@x{0}"), ("data wait", "@data{0.0} ms"),
                                                     ("gradient sync", "@sync{0.0} ms"),
                                                     ("checkpoint stall", "@ckpt{0.0} ms"),
                                                     ("compute", "@compute{0.0} ms")]))
        self.steps_fig.visible = False  # until a rank logs its steps' breakdown
        self.layout = column(row(self.train_fig, self.sys_fig), self.steps_fig, name="dlc-charts")

    # -- the train chart ----------------------------------------------------------------
    def _add_train_line(self, key) -> ColumnDataSource:
        """A rank's line, or past MAX_RANK_LINES ranks the mean with its min-max band (one
        source: x, y = mean, lo, hi) and, as found, an outlier rank's line."""
        # name: the benchmark and the browser test find the sources by it
        if key == "mean":
            source = ColumnDataSource({"x": [], "y": [], "lo": [], "hi": []}, name="dlc-train-mean")
            self.train_fig.varea("x", "lo", "hi", source=source, fill_color="#90a4ae",
                                 fill_alpha=0.35, legend_label=f"min-max of {self.train.world_size} ranks")
            self.train_fig.line("x", "y", source=source, line_width=2.5, color="black",
                                legend_label=f"mean of {self.train.world_size} ranks")
        else:
            source = ColumnDataSource({"x": [], "y": []}, name=f"dlc-train-{key}")
            outlier = not self.train.by_rank
            colour = _colour(self.train.outliers.index(key) + 3 if outlier else key)
            self.train_fig.line("x", "y", source=source, line_width=1.5, color=colour,
                                legend_label=f"rank {key}" + (" (outlier)" if outlier else ""))
        self.train_sources[key] = source
        return source

    def set_parent(self, label: str, points: dict[str, list]) -> None:
        """Draw the parent's curve of each metric ({metric: [(step, value)]}) muted, under
        the branch's own lines, on the same axes."""
        first = self.parent_label is None
        self.parent_label, self.parent_points = label, points
        if first:
            renderer = self.train_fig.line("x", "y", source=self.parent_source, line_width=2,
                                           color="#b0bec5", line_dash="dashed", legend_label=label)
            # drawn first: under every rank's line (a new list, so that bokeh sends the change)
            self.train_fig.renderers = [renderer] + [r for r in self.train_fig.renderers if r is not renderer]
        self._show_parent()

    def _show_parent(self) -> None:
        curve = self.parent_points.get(self.metric, [])
        self.parent_source.data = {"x": [p[0] for p in curve], "y": [p[1] for p in curve]}

    def select_metric(self, name: str) -> None:
        """Show train metric `name` (the full kept history of every line)."""
        self.metric = name
        if self.parent_label is not None:
            self._show_parent()
        for key in self.train.keys:
            if key not in self.train_sources:
                self._add_train_line(key)
        self.train_fig.title.text = name
        self.train_fig.yaxis.axis_label = name
        lines = self.train.lines.get(name, {})
        for key, source in self.train_sources.items():
            line = lines.get(key)
            source.data = ({n: list(v) for n, v in line.cols.items()} if line
                           else {n: [] for n in source.data})

    def push(self) -> int:
        """Send what changed since the last push; returns the number of points sent."""
        sent = 0
        steps_changed = False
        for name, lines in self.train.lines.items():
            for key, line in lines.items():
                change = line.take_new()
                if change is not None and name in BREAKDOWN_NAMES:
                    steps_changed = True
                if change is None or name != self.metric:
                    continue
                if key not in self.train_sources:  # an outlier rank just found
                    self._add_train_line(key)
                    change = ("reset", {n: list(v) for n, v in line.cols.items()})
                sent += self._apply(self.train_sources[key], change)
        for key, line in sorted(self.system.lines.items()):
            change = line.take_new()
            if change is None:
                continue
            source = self.sys_sources.get(key) or self._add_system_line(key)
            sent += self._apply(source, change)
        title = self._system_title()
        if title != self._sys_title:
            self.sys_fig.title.text = self._sys_title = title
        self._steps_dirty |= steps_changed
        if self._steps_dirty and time.monotonic() - self._steps_drawn_at >= STEPS_REDRAW_SECONDS:
            sent += self._draw_steps()
        return sent

    def flush_steps(self) -> None:
        """Draw the steps a throttled push left out (before the document is re-sent whole)."""
        if self._steps_dirty:
            self._draw_steps()

    # -- where each step goes -------------------------------------------------------------
    def select_steps_of(self, rank: int | None) -> None:
        """Draw the steps of `rank`, or with None the median over ranks."""
        self.steps_of = rank
        self.steps_fig.title.text = self._steps_title()
        self._draw_steps()

    def _draw_steps(self) -> int:
        self._steps_dirty, self._steps_drawn_at = False, time.monotonic()
        columns = step_breakdown(self.train, self.steps_of)
        self.steps_source.data = columns
        if columns["x"] and not self.steps_fig.visible:
            self.steps_fig.visible = True
        return len(columns["x"])

    def _steps_title(self) -> str:
        if self.steps_of is not None:
            who = f"rank {self.steps_of}"
        elif self.train.by_rank:
            who = "median of the ranks"
        else:
            who = f"mean of {self.train.world_size} ranks"
        return f"where each step goes ({who})"

    def _apply(self, source: ColumnDataSource, change: tuple[str, dict]) -> int:
        kind, columns = change
        if kind == "reset":
            source.data = columns
        else:
            source.stream(columns, rollover=self.capacity)
        return len(columns["x"])

    # -- the utilisation chart ----------------------------------------------------------
    def _pooled_system_line(self, index: int) -> tuple:
        source = ColumnDataSource({"x": [], "y": []}, name=f"dlc-sys-pool-{index}")
        line = self.sys_fig.line("x", "y", source=source, line_width=1.5, visible=False)
        item = LegendItem(label="", renderers=[line], visible=False)
        self.sys_legend.items.append(item)
        return source, line, item

    def _add_system_line(self, key: tuple) -> ColumnDataSource:
        node, device, name = key
        devices = sorted({(n, d) for n, d, _ in self.system.lines} | {(node, device)})
        colour = _colour(devices.index((node, device)))
        dash = "dashed" if name in ("gpu_mem", "mem_used") else "solid"
        if self._sys_pool:
            source, line, item = self._sys_pool.pop(0)
            source.name = f"dlc-sys-{node}-{device}-{name}"
            line.glyph.update(line_color=colour, line_dash=dash)
            line.visible = item.visible = True
            item.label = label_for(key)  # type: ignore[assignment]  # (bokeh takes a str)
        else:
            source = ColumnDataSource({"x": [], "y": []}, name=f"dlc-sys-{node}-{device}-{name}")
            self.sys_fig.line("x", "y", source=source, color=colour, line_width=1.5,
                              line_dash=dash, legend_label=label_for(key))
        self.sys_sources[key] = source
        return source

    def _system_title(self) -> str:
        if not self.system.lines:
            return "utilisation (waiting for samples)"
        if self.system.has_gpu():
            return "GPU util (solid), GPU memory (dashed)"
        return "no GPU: CPU util (solid), host memory (dashed)"
