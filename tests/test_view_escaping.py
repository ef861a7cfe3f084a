"""The notebook view renders stored values as text: a job's step, checkpoint step, reason,
rank fields and log lines holding markup must not become HTML in the widget (a real
launcher, a real failed job, the view refreshed in-process)."""

from __future__ import annotations

import os
import sqlite3

from conftest import wait_for

PAYLOAD = '<img src=x onerror="alert(1)">'

NOISY_FAILURE = f"""
print({PAYLOAD!r}, flush=True)
raise SystemExit(3)
"""


def test_view_escapes_everything_stored(launcher):
    from jupyter_dlc.widgets import JobView

    client = launcher.client
    script = launcher.script("noisy.py", NOISY_FAILURE)
    job = client.submit({"script": script, "name": "noisy", "max_restarts": 0})
    wait_for(lambda: client.job(job["id"])["state"] == "FAILED", timeout=90, what="the job to fail")
    # Values as a launcher without ingest checks stored them (reports are validated now, but a
    # data dir written before keeps what it has).
    db = sqlite3.connect(os.path.join(launcher.data_dir, "launcher.sqlite"))
    with db:
        db.execute("UPDATE jobs SET last_step = ?, reason = ?, last_loss = ? WHERE id = ?",
                   (PAYLOAD, PAYLOAD, PAYLOAD, job["id"]))
        db.execute("UPDATE ranks SET last_step = ?, state = ? WHERE job_id = ?",
                   (PAYLOAD, PAYLOAD, job["id"]))
        db.execute("INSERT INTO checkpoints (job_id, step, path, time, size) VALUES (?, ?, ?, ?, ?)",
                   (job["id"], PAYLOAD, PAYLOAD, PAYLOAD, 1))
    db.close()

    view = JobView(client, job["id"])
    wait_for(lambda: (view.refresh_now() or {}).get("reason") == PAYLOAD
             and "onerror" in view.log_view.value, timeout=30, what="the view to show the stored values")
    rendered = {name: getattr(view, name).value
                for name in ("header", "banner", "rank_table", "log_view", "action_note")}
    for name, value in rendered.items():
        assert "<img" not in value, f"{name} renders markup from the store: {value}"
    escaped = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"
    assert rendered["header"].count(escaped) >= 3, rendered["header"]  # step, checkpoint, reason
    assert escaped in rendered["rank_table"]
    assert escaped in rendered["log_view"]
    view.close()
