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
from collections.abc import Iterable
from typing import Callable

from ..client import LauncherError, LauncherUnavailable

BACKOFF = (0.5, 1, 2, 4, 8, 10)


class MetricsFollower:
    def __init__(self, client_of: Callable, job_id: str, since_of: Callable[[], int],
                 on_points: Callable[[dict, int], None], on_job: Callable[[dict], None],
                 on_state: Callable[[str], None],
                 band_of: Callable[[], Iterable[int] | None] = lambda: None):
        # client_of/since_of/band_of are read at each (re)connect: the view may have switched
        # to a launcher that came back on a new port, has polled points meanwhile, or has
        # found an outlier rank whose points it now wants as points (bands.py).
        self._client_of = client_of
        self.job_id = job_id
        self._since_of = since_of
        self._band_of = band_of
        self._renew = threading.Event()
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

    def renew(self) -> None:
        """Reconnect at the next line with what `since_of` and `band_of` say then; not a drop."""
        self._renew.set()

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
                self._renew.clear()
                since = self._since_of()
                stream = self._client_of().metrics_stream(self.job_id, since=since,
                                                          band=self._band_of())
                try:
                    for event, data in stream:
                        if self._stop.is_set() or self._cut.is_set() or self._renew.is_set():
                            break
                        self._set("live")
                        failures = 0
                        if event == "metrics":
                            # each answer starts where the one before ended
                            self._on_points(data, since)
                            since = int(data.get("last_seq") or since)
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
            if self._renew.is_set() and not self._cut.is_set():
                continue
            self.drops += 1
            self._set("down")
            self._stop.wait(BACKOFF[min(failures, len(BACKOFF) - 1)])
            failures += 1
        self._set("down")
