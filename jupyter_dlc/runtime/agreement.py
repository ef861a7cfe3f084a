"""Make every rank act on a stop or checkpoint request at the same step.

A SIGTERM or a launcher command reaches ranks at different moments, yet a checkpoint commits
only when every rank saved the same step. Ranks agree through the job's store, not with a
collective per step, which would cost every step and deadlock in scripts where only some
ranks call log(). One request round (an "episode" E) goes:

1. A rank holding a request publishes its kinds under `req<E>/<kind>` and bumps
   `req<E>/count` once, at its next step boundary. A watcher thread on every rank polls for
   that count key, so ranks that got no signal join at their next boundary too.
2. The rank whose bump makes the count equal the world size sets `req<E>/at` to its own step
   + 2. Every rank has joined by then and reads `at` at each boundary (one store round trip
   per step, only while an episode is open).
3. Each rank acts when its step reaches `at`. Ranks that synchronise every step (DDP) are at
   most one step apart, so none has passed `at` when it is set.

If `at` never comes (some rank never reaches a boundary), a rank holding a request acts alone
after EPISODE_TIMEOUT: a stop still stops, its checkpoint just cannot commit.
"""

import atexit
import threading
import time

from .control import CHECKPOINT, STOP

WATCH_INTERVAL = 0.2
EPISODE_TIMEOUT = 60.0


class StepAgreement:
    def __init__(self, store, world_size, namespace):
        self.store = store
        self.world_size = world_size
        self.namespace = namespace
        self.episode = 0
        self._joined_at = None
        self._published = set()
        self._remote_episode = -1  # the newest episode the watcher saw another rank open
        # The watcher is this object's: it ends with close() (at exit at the latest, while
        # the job's store still answers), or when the store went away with the job.
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="dlc-agreement", daemon=True)
        self._watcher.start()
        atexit.register(self.close)

    def close(self, timeout=1.0):
        """Stop the watcher and wait for it (at most one store round trip)."""
        self._closed.set()
        if self._watcher is not threading.current_thread():
            self._watcher.join(timeout)

    def idle(self):
        """No episode open here nor seen opened by another rank: poll() would return at once."""
        return self._joined_at is None and self._remote_episode != self.episode

    def poll(self, step, local_kinds):
        """The kinds to act on at this step; empty while training should go on."""
        if self._joined_at is None:
            if not local_kinds and self._remote_episode != self.episode:
                return set()
            self._joined_at = time.monotonic()
            self._publish(local_kinds)
            if self.store.add(self._key("count"), 1) == self.world_size:
                self.store.set(self._key("at"), str(step + 2))
        else:
            self._publish(local_kinds)
        if not self.store.check([self._key("at")]):
            if time.monotonic() - self._joined_at > EPISODE_TIMEOUT and local_kinds:
                self._close_episode()
                return set(local_kinds)
            return set()
        if step < int(self.store.get(self._key("at"))):
            return set()
        kinds = {kind for kind in (CHECKPOINT, STOP) if self.store.check([self._key(kind)])}
        self._close_episode()
        return kinds

    def _publish(self, kinds):
        for kind in set(kinds) - self._published:
            self.store.set(self._key(kind), "1")
            self._published.add(kind)

    def _close_episode(self):
        self.episode += 1
        self._joined_at = None
        self._published = set()

    def _key(self, name, episode=None):
        return f"{self.namespace}/req{self.episode if episode is None else episode}/{name}"

    def _watch(self):
        while not self._closed.is_set():
            episode = self.episode
            try:
                if self.store.check([self._key("count", episode)]):
                    self._remote_episode = episode
            except Exception:
                return  # the store went away with the job: nothing left to agree on
            self._closed.wait(WATCH_INTERVAL)
