"""layout.write_atomic / write_json / read_json: the one helper every record the launcher and
the nodes keep on disk is written with (pool records, connection files, standby go files,
node orders, exit codes, log cursors, cluster profiles, rank records).

Real processes on the real filesystem: two writers rewriting one file while a reader reads
it, and a writer killed with SIGKILL at random points of its writes. The fixed `path.tmp`
that the hand-written writes used fails the first (the two writers share the temp file, and
one renames the other's half-written one).
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap

from conftest import wait_for
from jupyter_dlc import layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = textwrap.dedent("""
    import sys
    from jupyter_dlc import layout
    path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pad = name * 200_000  # a document of 200 KB: written in several system calls
    i = 0
    while count < 0 or i < count:
        i += 1
        layout.write_json(path, {"writer": name, "i": i, "pad": pad})
""")


def _writer(path, name, count):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(count)],
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _check_whole(document, names):
    assert document is not None, "a reader found the file missing or torn"
    assert document["writer"] in names and document["pad"] == document["writer"] * 200_000


def test_two_writers_and_a_reader_never_see_a_torn_or_missing_document(tmp_path):
    path = tmp_path / "pool.json"
    layout.write_json(str(path), {"writer": "a", "i": 0, "pad": "a" * 200_000})
    writers = [_writer(path, name, 300) for name in "ab"]
    reads, seen = 0, set()
    while any(w.poll() is None for w in writers):
        document = layout.read_json(str(path))
        _check_whole(document, "ab")
        seen.add(document["writer"])
        reads += 1
    assert [w.returncode for w in writers] == [0, 0]
    assert reads > 10 and seen == {"a", "b"}, (reads, seen)
    assert sorted(os.listdir(tmp_path)) == ["pool.json"]  # no temp file left behind


def test_a_writer_killed_at_any_point_leaves_the_old_document_or_the_new(tmp_path):
    path = tmp_path / "record.json"
    rng = random.Random(7)
    last = 0
    for _ in range(12):
        writer = _writer(path, "k", -1)
        # Kill once the writer has replaced the file a few times, then at a random moment.
        wait_for(lambda: (layout.read_json(str(path)) or {}).get("i", 0) >= 3, 60,
                 interval=0.005, what="the writer's third write")
        for _ in range(rng.randrange(200)):
            layout.read_json(str(path))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        document = layout.read_json(str(path))
        _check_whole(document, "k")
        last = document["i"]
    assert last >= 3
    # What a kill can leave: temp files of that name only, which no reader opens.
    leftovers = [n for n in os.listdir(tmp_path) if n != "record.json"]
    assert all(n.startswith(".record.json.") and n.endswith(".tmp") for n in leftovers), leftovers


def test_modes_and_reads(tmp_path):
    old = os.umask(0o022)
    try:
        layout.write_json(str(tmp_path / "secret.json"), {"token": "t"}, mode=0o600)
        layout.write_atomic(str(tmp_path / "url"), "http://127.0.0.1:1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "secret.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "url").st_mode) == 0o644
    assert layout.read_json(str(tmp_path / "secret.json")) == {"token": "t"}
    (tmp_path / "torn.json").write_text('{"token": ')
    assert layout.read_json(str(tmp_path / "torn.json")) is None
    assert layout.read_json(str(tmp_path / "missing.json")) is None
    layout.write_atomic(str(tmp_path / "code"), "137\n")
    assert layout.read_int(str(tmp_path / "code")) == 137
    assert layout.read_int(str(tmp_path / "url")) is None
    layout.write_json_atomic(str(tmp_path / "manifest.json"), {"step": 4})  # the durable form
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"step": 4}
