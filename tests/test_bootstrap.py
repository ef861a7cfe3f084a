"""The rank bootstrap's records, run as torchrun runs it (a real interpreter, no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def _run(tmp_path, body: str) -> tuple[int, dict]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, DLC_ATTEMPT_DIR=str(tmp_path), RANK="0")
    proc = subprocess.run([sys.executable, "-m", "jupyter_dlc.runtime.bootstrap", str(script)],
                          env=env, timeout=60)
    return proc.returncode, json.loads((tmp_path / "rank-0.json").read_text())


def test_os_exit_is_recorded_with_its_code(tmp_path):
    """A script leaving with os._exit skips every exit handler; its code must still reach the
    rank record, or the launcher can only guess (from its agent) whether it was killed."""
    code, record = _run(tmp_path, """
        import os
        print("leaving", flush=True)
        os._exit(5)
        """)
    assert code == 5 and record["exit_code"] == 5 and record["end"] >= record["start"]


def test_a_forked_child_leaving_with_os_exit_does_not_end_the_rank(tmp_path):
    """DataLoader workers and other forked children leave with os._exit too: only the rank's
    own exit counts."""
    code, record = _run(tmp_path, """
        import json, os, sys
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        os.waitpid(pid, 0)
        with open(os.path.join(os.environ["DLC_ATTEMPT_DIR"], "rank-0.json")) as f:
            sys.stdout.write(json.dumps(json.load(f)))
            assert "exit_code" not in json.load(open(f.name))
        """)
    assert code == 0 and record["exit_code"] == 0
