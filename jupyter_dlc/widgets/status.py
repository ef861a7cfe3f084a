"""A live one-line status of a job (an ipywidgets.HTML fed by one updater thread).

Widget state travels over comm messages, which the front end routes by comm id, so a
thread can update it while the kernel runs other cells; the thread still adopts the
cell's parent header so that ipykernel 7 attributes its messages to this cell.
"""

from __future__ import annotations

import html
import threading

from .. import formatting
from ..client import TERMINAL, LauncherError

_COLOURS = {"SUCCEEDED": "#2e7d32", "FAILED": "#c62828", "STOPPED": "#6d4c41",
            "RUNNING": "#1565c0", "RESTARTING": "#ef6c00"}


def _kernel_parent():
    try:
        from ipykernel.kernelbase import Kernel

        kernel = Kernel.instance() if Kernel.initialized() else None
    except ImportError:
        kernel = None
    if kernel is None:
        return None, None
    return kernel, (kernel._parent_ident["shell"], kernel.get_parent())


class StatusLine:
    def __init__(self, client, job_id: str, interval: float = 0.5):
        import ipywidgets

        self.client = client
        self.job_id = job_id
        self.interval = interval
        self.widget = ipywidgets.HTML(value=html.escape(f"{job_id}: submitted"))
        self._stop = threading.Event()

    def render(self, job: dict) -> str:
        colour = _COLOURS.get(job["state"], "#555")
        text = html.escape(formatting.status_line(job)).replace("\n", "<br>")
        return f'<code style="color:{colour}">{text}</code>'

    def refresh_now(self) -> dict | None:
        try:
            job = self.client.job(self.job_id)
        except LauncherError as error:
            self.widget.value = html.escape(f"{self.job_id}: launcher unreachable ({error}); retrying")
            return None
        self.widget.value = self.render(job)
        return job

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)
        kernel, parent = _kernel_parent()
        thread = threading.Thread(target=self._run, args=(kernel, parent), daemon=True,
                                  name=f"dlc-status-{self.job_id}")
        thread.start()

    def _run(self, kernel, parent) -> None:
        if kernel is not None and parent is not None:
            kernel.set_parent(*parent, channel="shell")
        while not self._stop.wait(self.interval):
            job = self.refresh_now()
            if job is not None and job["state"] in TERMINAL:
                return

    def close(self) -> None:
        self._stop.set()
