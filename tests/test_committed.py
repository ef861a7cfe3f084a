"""launcher/committed.py on a real asyncio event loop: a report's commit wakes the metrics
streams of its job at once, and only those; a stream with nothing committed waits out its
timeout (it then looks at the store's write counter, as for writes made elsewhere)."""

from __future__ import annotations

import asyncio

from jupyter_dlc.launcher.committed import Committed


def test_a_commit_wakes_its_jobs_streams_and_no_others():
    async def scenario():
        committed = Committed()
        mine = [asyncio.ensure_future(committed.wait("job-a", 30.0)) for _ in range(2)]
        other = asyncio.ensure_future(committed.wait("job-b", 30.0))
        await asyncio.sleep(0)  # every stream waiting
        committed.notify("job-a")
        woken = await asyncio.wait_for(asyncio.gather(*mine), 5.0)
        assert woken == [True, True]
        assert not other.done()
        committed.notify("job-b")
        assert await asyncio.wait_for(other, 5.0) is True
        assert committed._waiting == {}  # nothing kept for streams that left

    asyncio.run(scenario())


def test_a_stream_with_nothing_committed_waits_out_its_timeout():
    async def scenario():
        committed = Committed()
        committed.notify("job-a")  # before anyone waits: nobody to wake, nothing kept
        assert await committed.wait("job-a", 0.05) is False
        assert committed._waiting == {}

    asyncio.run(scenario())
