"""The job view's HTML: pure functions from what the launcher answers (a job's detail, its
ranks page, its goodput ledger, alerts, evidence, diagnoses, log lines) to the HTML strings
the view's widgets show. No widget and no client here.

Everything the launcher stored came from a job (names, steps, reasons, log lines): it is
text, never markup, or a report could run script in the notebook. So every stored value
goes through `_text` (or `html.escape`) before it lands in the HTML, attributes included.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

from .. import formatting
from ..client import TERMINAL
from .ranktable import PAGE_SIZE

STATE_COLOURS = {"SUCCEEDED": "#2e7d32", "FAILED": "#c62828", "STOPPED": "#6d4c41",
                 "RUNNING": "#1565c0", "RESTARTING": "#ef6c00", "QUEUED": "#616161",
                 "PREFLIGHT": "#616161", "STARTING": "#00838f", "PENDING": "#8e24aa"}
# The ledger's parts as the bar stacks them, with their colours (the panel's detail.ts the same).
GOODPUT_COLOURS = {"productive": "#2e7d32", "data_wait": "#f9a825", "checkpoint_stall": "#6a1b9a",
                   "startup": "#0277bd", "waiting": "#9e9e9e", "lost_work": "#c62828",
                   "restart_downtime": "#ef6c00", "hung": "#4e342e", "stopped": "#607d8b",
                   "shutdown": "#b0bec5"}
NO_BOKEH_NOTE = (
    '<div class="dlc-needs-bokehjs" style="color:#888;font-size:11px">Charts need BokehJS, '
    "which the jupyter-dlc JupyterLab extension loads from this Jupyter server "
    "(/dlc/static/bokeh/). This front end has not loaded it, so the charts above stay empty; "
    "state, ranks, throughput, last loss and logs are complete without them.</div>")


def header_html(job_id: str, job: dict | None, note: str = "", steps_per_s: float | None = None,
                samples_per_s: float | None = None) -> str:
    """The header line: state, attempt, elapsed, step and progress, last loss, throughput
    (the view's own rates, from the points it drew), last checkpoint, parent; under it the
    view's note (e.g. "clone of ..."), storage trouble, the reason and the engine."""
    if job is None:
        return f"<b>{html.escape(job_id)}</b>: waiting for the launcher"
    state = _text(job["state"])
    colour = STATE_COLOURS.get(job["state"], "#555")
    parts = [
        f'<b>{_text(job["id"])}</b>',
        (f'<span class="dlc-state" data-state="{state}" style="background:{colour};color:white;'
         f'padding:1px 6px;border-radius:3px;font-weight:bold">{state}</span>'),
        f'attempt <b class="dlc-attempt">{_text(job.get("attempt"))}</b>',
        f"elapsed {_text(formatting.elapsed(job))}",
    ]
    if job.get("last_step") is not None:
        loss = job.get("last_loss")
        step = f'step <b class="dlc-step">{_text(job["last_step"])}</b>'
        progress = job.get("progress") or {}
        if progress.get("total_steps"):
            # "step 256 / 400, ETA 7 s" (formatting.progress_line), the step in bold
            rest = formatting.progress_line(progress).split(" / ", 1)[1]
            step += f' / <span class="dlc-progress">{_text(rest)}</span>'
        parts.append(step)
        if loss is not None:
            parts.append(f'loss <b class="dlc-loss">{_number(loss)}</b>')
    if steps_per_s is not None and state not in TERMINAL:
        parts.append(f"{steps_per_s:.1f} steps/s")
    elif steps_per_s is not None:
        parts.append(f"{steps_per_s:.1f} steps/s (at the end)")
    if samples_per_s is not None:
        parts.append(f"{samples_per_s:,.0f} samples/s (sum over ranks)")
    last = job.get("last_checkpoint")
    if last:
        when = time.strftime("%H:%M:%S", time.localtime(_seconds(last.get("time"))))
        parts.append(f"last checkpoint: step {_text(last.get('step'))} at {when} "
                     f"({_text(formatting.age(_seconds(last.get('time'))))} ago)")
    else:
        parts.append("no checkpoint yet")
    parent = job.get("parent")
    if parent:
        parts.append(f'<span class="dlc-parent">branched from {_text(parent.get("job"))} at step '
                     f'{_text(parent.get("step"))}</span>')
    text = " · ".join(parts)
    extra = []
    if note:
        extra.append(html.escape(note))
    if job.get("storage"):
        extra.append(f'<span class="dlc-storage" style="color:#c62828">{_text(job["storage"])}</span>')
    if state in ("FAILED", "STOPPED", "RESTARTING", "PENDING") and job.get("reason"):
        extra.append("reason: " + _text(job["reason"]))
    if formatting.engine_text(job):
        extra.append("engine: " + _text(formatting.engine_text(job)))
    limits = formatting.engine_limits_text(job)
    if limits:
        extra.append(f'<span class="dlc-engine-limits">{_text(limits)}</span>')
    if extra:
        text += '<br><span style="color:#555">' + " · ".join(extra) + "</span>"
    return f'<div class="dlc-header" style="font-family:var(--jp-ui-font-family,sans-serif)">{text}</div>'


def rank_pages_html(page: int, shown: int, total: int, pages: int) -> str:
    """"ranks 51-100 of 4096 · page 2 of 82" between the rank table's arrows."""
    first = page * PAGE_SIZE
    return (f'<span class="dlc-rank-pages" style="padding:0 6px">ranks {first + 1}-'
            f"{first + shown} of {total} · page {page + 1} of {pages}</span>")


def ranks_html(ranks: list[dict]) -> str:
    """The rank table of one page: node, rank, state, last step, heartbeat, exit code; a rank
    that exited non-zero in red."""
    if not ranks:
        return '<div class="dlc-ranks" style="color:#888">no ranks started yet</div>'
    cell = 'style="padding:1px 8px;text-align:left"'
    head = "".join(f"<th {cell}>{h}</th>" for h in
                   ("node", "rank", "state", "last step", "last heartbeat", "exit code"))
    rows = []
    for r in ranks:
        heartbeat = (formatting.age(r["last_heartbeat"]) + " ago") if r.get("last_heartbeat") else "-"
        values = (r.get("node"), r.get("rank"), r.get("state"),
                  "-" if r.get("last_step") is None else r["last_step"], heartbeat,
                  "-" if r.get("exit_code") is None else r["exit_code"])
        colour = "#c62828" if r.get("exit_code") not in (None, 0) else "inherit"
        rows.append(f'<tr class="dlc-rank" data-rank="{_text(r.get("rank"))}" style="color:{colour}">'
                    + "".join(f"<td {cell}>{html.escape(str(v))}</td>" for v in values) + "</tr>")
    return (f'<table class="dlc-ranks" style="border-collapse:collapse;font-size:12px">'
            f"<tr>{head}</tr>{''.join(rows)}</table>")


def banner_html(job_id: str, *, down: str | None = None, retry_every: float = 0.5,
                gone: str | None = None, alerts: Iterable[dict] = (), stragglers: Iterable[dict] = (),
                evidence: Sequence[dict] = (), diagnoses: Sequence[dict] = ()) -> str:
    """One banner a line, in this order: launcher unreachable (`down`, retried every
    `retry_every` seconds), job gone, active alerts, stragglers, the last evidence kept and
    the last two diagnoses (newest first), each as the launcher's events and job detail give
    them."""
    items = []
    if down:
        items.append(("#c62828", "launcher unreachable",
                      f"{down}; retrying every {retry_every:g}s, showing what was last known"))
    if gone:
        items.append(("#c62828", "job gone", gone))
    for event in alerts:
        data = event.get("data") or {}
        text = data.get("message") or event.get("reason") or ""
        rule = data.get("condition") or data.get("rule") or ""
        items.append(("#ef6c00", "alert", f"{text}" + (f" (rule: {rule})" if rule else "")))
    for s in stragglers:
        items.append(("#f9a825", "straggler", s.get("message") or s.get("key") or ""))
    for event in evidence[-1:]:
        data = event.get("data") or {}
        items.append(("#455a64", "evidence", f"attempt {event.get('attempt')}: {event.get('reason')} "
                      f"in {data.get('dir')} (`%dlc evidence {job_id}` lists it)"))
    for d in diagnoses[-2:][::-1]:
        where = (f"rank {d.get('rank')} on node {d.get('node')}" if d.get("rank") is not None
                 else "job")
        text = f"attempt {d.get('attempt')} failed: {d.get('class')} ({where}): " \
               f"{d.get('line') or d.get('reason') or ''}"
        if d.get("suggestion"):
            text += f" — what to do: {d['suggestion']}"
        items.append(("#6a1b9a", "diagnosis", text))
    return "".join(
        f'<div class="dlc-banner dlc-banner-{kind.split()[0]}" style="border-left:4px solid {colour};'
        f'background:#fafafa;padding:2px 8px;margin:2px 0"><b>{kind}</b>: {_text(text)}</div>'
        for colour, kind, text in items)


def logs_html(items: Iterable[tuple]) -> str:
    """The log tail from (counter, rank, text) items: "[rank] text", or the bare text of a
    line without a rank (an attempt's separator)."""
    text = "\n".join(f"[{r}] {t}" if r is not None else t for _, r, t in items)
    return ('<pre class="dlc-logs" style="max-height:220px;overflow:auto;font-size:11px;'
            f'margin:0;background:#f7f7f7;padding:4px">{html.escape(text) or "(no output yet)"}</pre>')


def retention_note_html(text: str) -> str:
    """The note under the charts when older points are downsampled (empty when none are)."""
    return f'<span class="dlc-retention-note">{html.escape(text)}</span>' if text else ""


def error_note_html(message: str) -> str:
    """Why a button's action failed, beside the buttons."""
    return f'<span style="color:#c62828">{html.escape(message)}</span>'


def goodput_bar_html(ledger: dict | None) -> str:
    """One stacked bar of where the job's wall time went, with the goodput percentage;
    each part's seconds in its tooltip and the legend under it."""
    if not ledger or not ledger.get("wall_seconds"):
        return ""
    wall = ledger["wall_seconds"]
    segments, legend = [], []
    for key, label in formatting.GOODPUT_PARTS:
        seconds = ledger["parts"].get(key, 0.0)
        if seconds <= 0:
            continue
        share = 100 * seconds / wall
        tip = _text(f"{label}: {formatting.duration(seconds)} ({share:.1f}%)")
        segments.append(f'<div class="dlc-goodput-part" data-part="{key}" title="{tip}" '
                        f'style="width:{share:.3f}%;background:{GOODPUT_COLOURS[key]}"></div>')
        if seconds >= 0.5:
            legend.append(f'<span style="color:{GOODPUT_COLOURS[key]}">■</span> {tip}')
    percent = _text(formatting.percent(ledger.get("goodput")))
    return (f'<div class="dlc-goodput" style="font-family:var(--jp-ui-font-family,sans-serif);'
            f'font-size:12px;margin:2px 0">goodput <b class="dlc-goodput-value">{percent}</b> '
            f'of {_text(formatting.duration(wall))}'
            f'<div class="dlc-goodput-bar" style="display:flex;height:10px;width:100%;'
            f'max-width:600px;background:#eee;border-radius:2px;overflow:hidden">{"".join(segments)}</div>'
            f'<div style="color:#555;font-size:11px">{" · ".join(legend)}</div></div>')


def _text(value) -> str:
    """Any stored value as HTML text: escaped, quotes included (it may sit in an attribute)."""
    return html.escape(str(value), quote=True)


def _number(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return _text(value)


def _seconds(value) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
