"""Live job views in the notebook. `show_job` displays one and returns it."""

from __future__ import annotations


def show_job(client, job_id: str):
    from .status import StatusLine

    view = StatusLine(client, job_id)
    view.show()
    return view
