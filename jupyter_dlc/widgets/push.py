"""`MetricsFollower`: one job's metric points pushed by the launcher, on a thread of its own.

The launcher's `GET /api/jobs/{job}/metrics/stream?since=SEQ` sends every point as soon as
its report is stored (server-sent events). The follower reads it and hands each batch to
the view at once, so a point is drawn without waiting for a poll. Its `state` tells the
view what to do meanwhile:

- "connecting", "live": the stream delivers; the view does not poll metrics;
- "down": the stream dropped or was refused; the view polls `metrics?since=` as before,
  and the follower reconnects with backoff (0.5 s doubling to 10 s), resuming from the
  view's last seq, so a point is neither lost nor drawn twice (the view drops seqs it has).
"""

from __future__ import annotations

import threading
from typing import Callable

from ..client import LauncherError, LauncherUnavailable

BACKOFF = (0.5, 1, 2, 4, 8, 10)


class MetricsFollower:
    def __init__(self, client_of: Callable, job_id: str, since_of: Callable[[], int],
                 on_points: Callable[[list, int, dict | None], None], on_job: Callable[[dict], None],
                 on_state: Callable[[str], None]):
        # client_of/since_of are read at each (re)connect: the view may have switched to a
        # launcher that came back on a new port, and has polled points meanwhile.
        self._client_of = client_of
        self.job_id = job_id
        self._since_of = since_of
        self._on_points = on_points
        self._on_job = on_job
        self._on_state = on_state
        self.state = "connecting"
        self.drops = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dlc-push-{job_id}")

    def start(self) -> "MetricsFollower":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Leave at the next line the launcher sends (a ping at the latest, every 5 s)."""
        self._stop.set()

    def cut(self) -> None:
        """Drop the connection at the next line, as a network failure would (tests)."""
        self._cut.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _set(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._on_state(state)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._cut.clear()
            try:
                stream = self._client_of().metrics_stream(self.job_id, since=self._since_of())
                try:
                    for event, data in stream:
                        if self._stop.is_set() or self._cut.is_set():
                            break
                        self._set("live")
                        failures = 0
                        if event == "metrics":
                            self._on_points(data.get("points") or [], int(data.get("last_seq") or 0),
                                            data.get("downsampled"))
                        elif event == "job":
                            self._on_job(data)
                        elif event == "deleted":
                            self._stop.set()
                finally:
                    stream.close()
            except LauncherError as error:
                if error.status == 404:  # the job is gone: nothing more will come
                    self._stop.set()
            except (LauncherUnavailable, OSError, ValueError):
                pass  # refused, reset, timed out, a line cut in half: reconnect below
            except Exception as error:  # a bug must not end the follower; the view polls instead
                self.last_error = f"{type(error).__name__}: {error}"
            if self._stop.is_set():
                break
            self.drops += 1
            self._set("down")
            self._stop.wait(BACKOFF[min(failures, len(BACKOFF) - 1)])
            failures += 1
        self._set("down")
