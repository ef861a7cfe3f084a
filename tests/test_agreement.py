"""Step agreement (runtime/agreement.py) over a real torch TCPStore on loopback: two ranks'
agreements in one process, as two ranks of a job hold them, and the watcher thread's
lifecycle (its owner stops and joins it)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from jupyter_dlc.runtime.agreement import StepAgreement
from jupyter_dlc.runtime.control import STOP


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield master


def test_a_request_on_one_rank_stops_both_at_the_same_step_and_close_joins_the_watcher(store):
    ours, theirs = StepAgreement(store, 2, "t"), StepAgreement(store, 2, "t")
    try:
        assert ours.poll(10, {STOP}) == set()  # ours opens the episode at step 10
        seen = threading.Event()
        # theirs learns of it through its watcher, not through a signal of its own
        for _ in range(100):
            if theirs._remote_episode == theirs.episode:
                seen.set()
                break
            seen.wait(0.05)
        assert seen.is_set()
        assert theirs.poll(10, set()) == set()  # joins: the count reaches 2, at = 12
        assert ours.poll(11, set()) == set() and theirs.poll(11, set()) == set()
        assert ours.poll(12, set()) == {STOP} and theirs.poll(12, set()) == {STOP}
    finally:
        for agreement in (ours, theirs):
            agreement.close()
    assert not ours._watcher.is_alive() and not theirs._watcher.is_alive()
