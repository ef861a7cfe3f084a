"""Jobs side by side in a notebook (`%dlc compare A B ...`): one metric overlaid against step
and against wall time, a table of last and best values, the spec fields that differ, and the
code diff against the first job. Read when shown and again on Refresh (the jobs may still
run); every value came from a job, so it is escaped as text."""

from __future__ import annotations

import html

from bokeh.layouts import row
from bokeh.models import ColumnDataSource, HoverTool, Legend
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from .. import compare
from .charts import HEIGHT, WIDTH, JobChartsModel


class CompareView:
    def __init__(self, client, refs: list[str], metric: str = "loss"):
        import ipywidgets as w

        self.client = client
        self.refs = list(refs)
        self.metric = metric
        self.jobs = compare.gather(client, self.refs, metric)
        self.values = w.HTML()
        self.fields = w.HTML()
        self.code = w.HTML()
        self.refresh_button = w.Button(description="Refresh", tooltip="read the jobs again")
        self.refresh_button.on_click(lambda _button: self.refresh_now())
        self.bokeh = JobChartsModel(self._figures())
        self.widget = w.VBox([self.refresh_button, self.values, self.bokeh, self.fields, self.code])
        self._render()

    def show(self) -> CompareView:
        from IPython.display import display

        display(self.widget)
        return self

    def refresh_now(self) -> None:
        self.jobs = compare.gather(self.client, [c.job["id"] for c in self.jobs], self.metric)
        self.bokeh.update_from_model(self._figures())
        self._render()

    def _figures(self):
        by_step = figure(name="dlc-compare-step", width=WIDTH, height=HEIGHT, title=f"{self.metric} by step",
                         x_axis_label="step", y_axis_label=self.metric, tools="pan,wheel_zoom,box_zoom,reset,save")
        by_time = figure(name="dlc-compare-time", width=WIDTH, height=HEIGHT,
                         title=f"{self.metric} by wall time since submit", x_axis_label="seconds",
                         y_axis_label=self.metric, tools="pan,wheel_zoom,box_zoom,reset,save")
        for fig, x in ((by_step, 0), (by_time, 1)):
            fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt", spacing=0, padding=4), "right")
            for i, c in enumerate(self.jobs):
                source = ColumnDataSource({"x": [p[x] for p in c.points], "y": [p[2] for p in c.points]},
                                          name=f"dlc-compare-{'step' if x == 0 else 'time'}-{i}")
                fig.line("x", "y", source=source, line_width=2, color=Category10_10[i % len(Category10_10)],
                         legend_label=c.job["id"][:40])
            fig.add_tools(HoverTool(tooltips=[("x", "@x{0.0}"), (self.metric, "@y{0.0000}")]))
        return row(by_step, by_time)

    def _render(self) -> None:
        text = compare.value_text
        best = min((c.best for c in self.jobs if c.best is not None), default=None)
        rows = "".join(
            f'<tr class="dlc-compared" data-job="{_esc(c.job["id"])}"'
            + (' data-best="1"' if best is not None and c.best == best else "") + ">"
            + "".join(f"<td>{_esc(v)}</td>" for v in (
                c.job["id"], c.job["state"], max(c.points)[0] if c.points else "-", text(c.last), text(c.best)))
            + "</tr>" for c in self.jobs)
        self.values.value = (f'<table class="dlc-compare"><thead><tr><th>job</th><th>state</th><th>steps</th>'
                             f"<th>last {_esc(self.metric)}</th><th>best {_esc(self.metric)}</th></tr></thead>"
                             f"<tbody>{rows}</tbody></table>")
        found = compare.differences(self.jobs)
        head = "".join(f"<th>{_esc(c.job['id'])}</th>" for c in self.jobs)
        body = "".join(f'<tr class="dlc-differs" data-field="{_esc(name)}"><td>{_esc(name)}</td>'
                       + "".join(f"<td>{_esc(text(v))}</td>" for v in values) + "</tr>" for name, values in found)
        self.fields.value = (f'<table class="dlc-differences"><thead><tr><th>differs</th>{head}</tr></thead>'
                             f"<tbody>{body}</tbody></table>" if found else "<i>no spec field differs</i>")
        blocks = []
        for other in self.jobs[1:]:
            lines = compare.code_diff(self.jobs[0], other)
            shown = "\n".join(_diff_line(line) for line in lines) or \
                f"the code of {_esc(other.job['id'])} is the same as {_esc(self.jobs[0].job['id'])}'s"
            blocks.append(f'<pre class="dlc-code-diff" data-job="{_esc(other.job["id"])}" '
                          f'style="font-size:11px;max-height:24em;overflow:auto">{shown}</pre>')
        self.code.value = "".join(blocks)


def _diff_line(line: str) -> str:
    colour = "#2e7d32" if line.startswith("+") and not line.startswith("+++") else \
        "#c62828" if line.startswith("-") and not line.startswith("---") else None
    return f'<span style="color:{colour}">{_esc(line)}</span>' if colour else _esc(line)


def _esc(value) -> str:
    return html.escape(str(value), quote=True)
