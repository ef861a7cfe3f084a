"""Live job views in the notebook: `show_job(client, job_id)` displays a `JobView` and returns it.

`%%dlc` and `%dlc attach JOB` call `show_job`. `view.py` puts the view together from its
parts: `job_widgets.py` (what it shows, and what happens in front ends that do not load
BokehJS: the text parts still work; the charts need BokehJS, which our JupyterLab extension
loads from the Jupyter server extension, never from a CDN or inlined), `job_updater.py` (its
one updater thread, the stream follower and each refresh), `job_html.py` (the HTML of its
text parts) and `followed_job.py` (what it knows of the job it follows).
"""

from __future__ import annotations

import weakref

from .view import JobView

_views: "weakref.WeakValueDictionary[int, JobView]" = weakref.WeakValueDictionary()
_order: list[int] = []


def show_job(client, job_id: str, **options) -> JobView:
    """Display a live view of `job_id` under the running cell and start its updater thread.

    Re-attaching (after a kernel restart, or in another notebook) shows the whole history:
    the view reads metrics from seq 0 (lines halve their resolution past `capacity` points)
    and the last `log_lines` lines of each rank's log."""
    view = JobView(client, job_id, **options)
    view.show()
    _views[id(view)] = view
    _order.append(id(view))
    return view


def show_sweep(client, sweep_id: str, **options):
    """Display a live view of a sweep's trials (widgets/sweep.py) and start its updater."""
    from .sweep import SweepView

    return SweepView(client, sweep_id, **options).show()


def show_compare(client, refs: list[str], metric: str = "loss"):
    """Display jobs side by side (widgets/compare.py)."""
    from .compare import CompareView

    return CompareView(client, refs, metric).show()


def views() -> list[JobView]:
    """The views shown in this kernel that still exist, oldest first."""
    alive = [_views[i] for i in _order if i in _views]
    _order[:] = [id(v) for v in alive]
    return alive


__all__ = ["JobView", "show_compare", "show_job", "show_sweep", "views"]
