"""POST /api/jobs/{job}/node-logs (launcher/node_logs.py): what a node that does not see the
job directory (Slurm without a shared filesystem) may append to the attempt's logs, and what
it may not: another node's ranks, a node the job does not have, an attempt that ended, a path
of its choosing, more than a body may carry, anything without the token."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from conftest import wait_for
from test_jobs import SLEEPER

from jupyter_dlc import layout


def post(client, job_id: str, body, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{client.url}/api/jobs/{job_id}/node-logs", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"token {token or client.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_node_appends_only_to_its_own_logs_of_the_current_attempt(launcher):
    client = launcher.client
    job = client.submit({"script": launcher.script("sleeper.py", SLEEPER), "nodes": 2, "nproc_per_node": 2})
    wait_for(lambda: client.job(job["id"])["state"] == "RUNNING", 60, what="RUNNING")
    attempt_dir = layout.attempt_dir(client.job(job["id"])["job_dir"], 1)
    try:
        ok = {"attempt": 1, "node": 1, "logs": [{"rank": 3, "text": "from node 1\n"},
                                                {"rank": None, "text": "agent says hi\n"}]}
        assert post(client, job["id"], ok) == (200, {"ok": True})
        with open(layout.rank_log(attempt_dir, 3)) as f:
            assert "from node 1\n" in f.read()
        with open(layout.node_log(attempt_dir, 1)) as f:
            assert "agent says hi\n" in f.read()
        lines = [line["text"] for line in client.logs(job["id"], rank=3)["lines"]]
        assert "from node 1" in lines  # the logs route reads it as a rank's own output

        for body, status, error in (
                (dict(ok, logs=[{"rank": 0, "text": "x\n"}]), 400,
                 "logs[0].rank: rank 0 does not run on node 1 (its ranks are 2-3)"),
                (dict(ok, node=5), 400, "node: node 5 does not exist in a job of 2 node(s) (nodes 0-1)"),
                (dict(ok, logs=[{"rank": "../../x", "text": "x\n"}]), 400, "logs[0].rank: expected a whole number"),
                (dict(ok, logs=[{"rank": 3, "text": "x" * (1 << 20 | 1)}]), 400, "logs[0].text: length"),
                (dict(ok, logs=[{"rank": 2, "text": "y" * (600 << 10)}, {"rank": 3, "text": "z" * (600 << 10)}]),
                 400, "logs: 1228800 bytes of text; at most 1048576 a request")):
            code, answer = post(client, job["id"], body)
            assert code == status and answer["error"].startswith(error), answer
        assert post(client, job["id"], dict(ok, attempt=2)) == (200, {"ok": True, "stale": True})
        assert post(client, job["id"], ok, token="not-the-token")[0] == 401
        assert post(client, "no-such-job", ok, token="not-the-token")[0] == 401  # says nothing of it
        assert sorted(n for n in os.listdir(attempt_dir) if n.endswith(".log")) == \
            ["node-0.log", "node-1.log", "rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"]
    finally:
        client.stop(job["id"], grace=1)
        client.wait(job["id"], timeout=60)


def test_a_slurm_node_sends_complete_lines_a_line_longer_than_a_batch_in_pieces_and_the_rest_at_the_end(tmp_path):
    """slurm_node.LogSender's batches (no launcher needed to build them): complete lines while
    the node runs; a line longer than a batch in pieces, or its log would wait for ever; the
    last line without its newline once the node's processes are gone."""
    from jupyter_dlc.node import slurm_node

    (tmp_path / "node-0.log").write_bytes(b"agent line\nhalf")
    (tmp_path / "rank-1.log").write_bytes(b"x" * (slurm_node.BATCH_BYTES + 100))
    sender = slurm_node.LogSender({"DLC_LAUNCHER_URL": "http://127.0.0.1:9", "DLC_JOB_ID": "j",
                                   "DLC_TOKEN": "t", "DLC_ATTEMPT": "1"}, str(tmp_path), 0)

    def batch(final=False):
        entries, moved = sender._batch(final)
        sender.offsets.update(moved)
        return [(e["rank"], len(e["text"]), e["text"][:12]) for e in entries]

    assert batch() == [(None, 11, "agent line\n")]  # rank 1's long line waits for a batch of its own
    assert batch() == [(1, slurm_node.BATCH_BYTES + 1, "xxxxxxxxxxxx")]
    assert batch() == []  # the rest of the long line and "half" are not lines yet
    assert batch(final=True) == [(None, 5, "half\n"), (1, 101, "x" * 12)]
    assert batch(final=True) == []
