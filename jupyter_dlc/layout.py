"""Where job files live, and what a committed checkpoint step is.

The runtime (which writes and restores checkpoints) and the launcher (which picks
DLC_RESUME_PATH) must agree exactly on when a step counts, and neither may import the other,
so the one definition lives here. Imports nothing of ours.

A step counts only when `step-<N>/manifest.json` exists, parses, and every file it lists is
present with the listed size. The manifest is written last and atomically, so a crash at any
moment leaves either a committed step or one that does not count.
"""

import hashlib
import json
import os
import re
import shutil
import threading
import time

MANIFEST = "manifest.json"
_STEP_DIR_NAME = re.compile(r"^step-(\d+)$")
_HASH_CHUNK = 1 << 20


# -- job directory ------------------------------------------------------------------------

def attempt_dir(job_dir_path, attempt):
    return os.path.join(job_dir_path, f"attempt-{attempt}")


def rank_log(attempt_dir_path, rank):
    return os.path.join(attempt_dir_path, f"rank-{rank}.log")


def rank_json(attempt_dir_path, rank):
    return os.path.join(attempt_dir_path, f"rank-{rank}.json")


def rank_error_json(attempt_dir_path, rank):
    return os.path.join(attempt_dir_path, f"rank-{rank}.error.json")


# A rank's records travel as report events too, so that a launcher whose ranks run on other
# hosts needs no shared filesystem for them: the same facts as rank-R.json (start: pid, node,
# local_rank, start; end: exit_code, end) and rank-R.error.json (error, message, traceback).
RANK_START, RANK_END, RANK_ERROR = "rank_start", "rank_end", "rank_error"
# A node's preflight result (where the engine runs preflight on its nodes: Slurm).
NODE_PREFLIGHT = "node_preflight"
# A node's exit code, sent by the node's own task where the launcher cannot read its
# `node-K.exit` (Slurm without a shared filesystem), with the engine job that ran it.
NODE_EXIT = "node_exit"
RECORD_EVENTS = (RANK_START, RANK_END, RANK_ERROR, NODE_PREFLIGHT, NODE_EXIT)
# A node preflight's exit code when its verdict could not be delivered to the launcher (the
# node cannot reach the launcher's advertised URL): the engine names that as the reason,
# since no `node_preflight` event will ever say it, and the attempt fails once, unretried.
PREFLIGHT_UNREACHABLE = 4


def node_preflight_code(attempt_dir_path, node):
    """Where an engine whose keepers run beside the launcher (SSH) records node `node`'s
    preflight exit code."""
    return os.path.join(attempt_dir_path, f"node-{node}.preflight")


# Set to "report" by an engine whose ranks do not share the launcher's job directory: the
# bootstrap then writes no record files (the route is the only source, and the tests prove it).
RECORDS_ENV = "DLC_RANK_RECORDS"
# A rank's reporter retries a launcher that does not answer at most this far apart: the
# launcher judges a rank's silence from its own start plus this (supervisor.heard).
REPORT_MAX_BACKOFF = 5.0
# A report event's text fields are capped (spec.MAX_TEXT); a traceback keeps its tail.
RECORD_TEXT = 4000


def preflight_marker(checkpoint_dir, job_id, attempt):
    """The file node 0's preflight writes into the checkpoint directory for every node to read
    back (node/preflight.py); `attempt="*"` is the glob of every attempt's."""
    return os.path.join(checkpoint_dir, f".dlc-preflight-{job_id}-a{attempt}")


def node_log(attempt_dir_path, node):
    return os.path.join(attempt_dir_path, f"node-{node}.log")


def node_exit(attempt_dir_path, node):
    return os.path.join(attempt_dir_path, f"node-{node}.exit")


def default_checkpoint_dir(job_dir_path):
    return os.path.join(job_dir_path, "checkpoints")


# -- capped rank logs ---------------------------------------------------------------------
#
# A rank that prints without end must not fill the disk the launcher's store is on (issue
# 26: a 50 MB print on a 16 MiB data dir stranded a job). Its log keeps its first half-cap
# and a rolling last half-cap; the middle is punched out of the file (a hole: no blocks, the
# file keeps its length), so every byte offset a reader holds (the logs route's cursors, the
# alert rules', a tail) stays valid, and a marker line where the head ends says how much was
# dropped. Readers skip the hole (`read_log_lines`). A file system without hole punching
# keeps the tail in memory and writes it after the head when the log closes.

LOG_CAP_ENV = "DLC_RANK_LOG_MIB"
DEFAULT_LOG_MIB = 16
_LOG_BLOCK = 1 << 16  # punches and the marker's room are whole blocks of this
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
# A log stops growing (and rolls within what it holds) once the disk has less free than
# this: the launcher's store on the same disk needs room for state changes and verdicts.
LOG_DISK_MARGIN = 4 << 20


# How a DLC_* switch that is on by default is turned off ("DLC_STEP_BREAKDOWN=0").
OFF_WORDS = ("0", "off", "false", "no")


def switched_off(value):
    """Whether a switch's value (None: unset) turns it off."""
    return value is not None and value.strip().lower() in OFF_WORDS


def log_cap(environ=None):
    """Bytes a rank log may hold ($DLC_RANK_LOG_MIB, default 16 MiB; 0: no cap)."""
    raw = (os.environ if environ is None else environ).get(LOG_CAP_ENV, "").strip()
    try:
        mib = float(raw) if raw else DEFAULT_LOG_MIB
    except ValueError:
        mib = DEFAULT_LOG_MIB
    if mib <= 0:
        return 0
    return max(int(mib * (1 << 20)), 4 * _LOG_BLOCK)


def _punch(fd, offset, length):
    """Free the blocks of [offset, offset + length) keeping the file's size; False where the
    file system cannot."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc.fallocate(fd, _FALLOC_PUNCH, offset, length) == 0


class CappedLog:
    """An append-only log of at most `cap` bytes on disk: the first half and a rolling last
    half, with a marker line between saying how much was dropped. Writes never raise: what
    the disk refuses is counted as dropped, and from then on the log rolls within what it
    already holds, so the space a full disk gets back goes to the store, not to this log."""

    def __init__(self, path, cap):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size  # logical: every byte ever written counts
        self.directory = os.path.dirname(path) or "."
        self.refused = 0  # bytes the disk refused (not the middle cut out)
        self.marked = False
        self.frozen = False
        self.pending = None  # the tail, in memory, where holes cannot be punched
        self._next_look = 0
        self._set_cap(cap)

    def _set_cap(self, cap):
        self.cap = cap
        self.head = max(_LOG_BLOCK, (cap // 2) // _LOG_BLOCK * _LOG_BLOCK)
        # The tail grows by up to `slack` between two cuts: the file holds at most head, the
        # marker's block, tail and slack.
        self.slack = max(_LOG_BLOCK, cap // 16 // _LOG_BLOCK * _LOG_BLOCK)
        self.tail = max(_LOG_BLOCK, cap - self.head - _LOG_BLOCK - self.slack)
        self.cut = self.head + _LOG_BLOCK  # [head + block, cut) is the hole

    def write(self, data):
        if self.cap and self.pending is not None:
            self.pending += data
            del self.pending[:max(0, len(self.pending) - self.tail)]
            self.size += len(data)
            return
        if self.cap and not self.frozen and self.size >= self._next_look:
            self._look_at_disk()
        if self.cap and self.size + len(data) - self.cut > self.tail + self.slack:
            self._cut(len(data))  # before the write: what it holds never exceeds the cap
        if self.pending is not None:
            self.write(data)
            return
        view = memoryview(data)
        while view:
            try:
                written = os.pwrite(self.fd, view, self.size)
            except OSError:
                # A full disk (or a file system gone): the rank must go on regardless.
                self.refused += len(view)
                self.size += len(view)
                self._freeze()
                return
            self.size += written
            view = view[written:]

    def _look_at_disk(self):
        self._next_look = self.size + (1 << 20)
        try:
            stat = os.statvfs(self.directory)
        except OSError:
            return
        if stat.f_bavail * stat.f_frsize < LOG_DISK_MARGIN:
            self._freeze()

    def _freeze(self):
        """Little or no room left on the disk: from now on roll within what this log holds."""
        if self.frozen or not self.cap:
            return
        self.frozen = True
        try:
            held = os.fstat(self.fd).st_blocks * 512
        except OSError:
            return
        if not self.marked:  # nothing cut yet: what it holds becomes its head and tail
            self._set_cap(min(self.cap, max(held, 4 * _LOG_BLOCK)))
        else:
            self.tail = max(_LOG_BLOCK, min(self.tail, held - self.head - _LOG_BLOCK - self.slack))

    def _cut(self, coming):
        end = (self.size + coming - self.tail) // _LOG_BLOCK * _LOG_BLOCK
        end = min(end, self.size // _LOG_BLOCK * _LOG_BLOCK)
        if end <= self.cut:
            return
        try:
            punched = _punch(self.fd, self.cut, end - self.cut)
        except (OSError, AttributeError):
            punched = False
        if not punched:
            self._keep_tail_in_memory()
            return
        self.cut = end
        self._blank_partial_line(end)
        self.marked = True
        self._mark()

    def _keep_tail_in_memory(self):
        """Holes cannot be punched here: the file keeps its head, the tail is held here and
        written after it when the log closes."""
        try:
            self.pending = bytearray(os.pread(self.fd, self.tail, max(self.head, self.size - self.tail)))
            os.ftruncate(self.fd, self.head + _LOG_BLOCK)
        except OSError:
            self.pending = bytearray()

    def _blank_partial_line(self, at):
        """The kept tail starts inside a line: blank it up to its end (readers skip NULs)."""
        try:
            data = os.pread(self.fd, _LOG_BLOCK, at)
            end = data.find(b"\n") + 1
            if end:
                os.pwrite(self.fd, b"\0" * end, at)
        except OSError:
            pass

    def _mark(self):
        text = (f"\n[jupyter-dlc] {_mib(self.cut - self.head)} of output dropped here: this log "
                f"keeps its first {_mib(self.head)} and its last {_mib(self.tail)} "
                f"(set {LOG_CAP_ENV} to keep more)")
        if self.refused:
            text += f"; the disk was full and refused {_mib(self.refused)}"
        line = (text + "\n").encode()[:_LOG_BLOCK]
        try:
            os.pwrite(self.fd, line + b"\0" * (_LOG_BLOCK - len(line)), self.head)
        except OSError:
            pass

    def close(self):
        if self.pending is not None:
            self.cut = self.size - len(self.pending)
            self._mark()
            start = self.pending.find(b"\n") + 1
            try:
                os.pwrite(self.fd, bytes(self.pending[start:]), self.head + _LOG_BLOCK)
            except OSError:
                pass
        os.close(self.fd)


def _mib(size):
    return f"{size / (1 << 20):.1f} MiB"


def read_log_lines(path, start=0, limit=2 << 20):
    """Complete lines of a (capped) log from byte `start`, at most `limit` bytes' worth, the
    dropped middle skipped; returns them and the offset after the last one."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = b""
            for _ in range(3):  # the marker's padding, then the hole, then the tail
                if start >= size:
                    return [], start
                try:
                    start = os.lseek(f.fileno(), start, os.SEEK_DATA)
                except OSError:
                    pass  # no data after `start` (ENXIO), or no SEEK_DATA here: read as is
                f.seek(start)
                data = f.read(max(0, min(size - start, limit)))
                blank = len(data) - len(data.lstrip(b"\0"))
                start += blank
                data = data[blank:]
                if data or not blank:
                    break
    except OSError:
        return [], start
    cut = data.rfind(b"\n") + 1
    text = data[:cut].replace(b"\0", b"")
    return text.decode("utf-8", errors="replace").splitlines(), start + cut



def read_log(path, start=0, tail=None, limit=2 << 20):
    """Complete lines of a log from byte `start` (or its last `tail` lines, from no earlier
    than `start`); returns them and the new offset. A file shorter than `start` was replaced:
    read from its beginning. Nothing is read when the file holds nothing new (one stat), so
    a look at thousands of quiet rank logs stays cheap."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], start
    if start > size:
        start = 0
    elif start == size:
        return [], start
    if tail is not None:
        start = max(start, size - max(tail, 1) * 400 - 4096)
    text, end = read_log_lines(path, start, limit)
    if tail is not None:
        text = text[-tail:] if tail > 0 else []
    return text, end

# -- the node-held copy of the newest committed step ---------------------------------------

def node_copy_root():
    """Shared memory on this node ($DLC_SHM_DIR, else /dev/shm), one directory per user."""
    return os.path.join(os.environ.get("DLC_SHM_DIR") or "/dev/shm", f"jupyter-dlc-{os.getuid()}")


def node_copy_dir(job_dir_path):
    """Where this node holds its ranks' copies of the job's newest committed step (written by
    runtime/node_copy.py, removed by the launcher when the job ends). Named by the job id and
    a digest of its job directory, so that two launchers' jobs never share one, and a launcher
    recognises its own."""
    job_dir = os.path.abspath(job_dir_path)
    digest = hashlib.sha256(job_dir.encode()).hexdigest()[:12]
    return os.path.join(node_copy_root(), f"{os.path.basename(job_dir)}-{digest}")


def node_copy_jobs():
    """{job id: directory} of every node copy on this node, whoever's."""
    try:
        names = os.listdir(node_copy_root())
    except OSError:
        return {}
    return {name.rpartition("-")[0]: os.path.join(node_copy_root(), name)
            for name in names if "-" in name}


def make_node_copy_dir(job_dir_path):
    root = node_copy_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.makedirs(node_copy_dir(job_dir_path), mode=0o700, exist_ok=True)
    return node_copy_dir(job_dir_path)


def discard_node_copy(path):
    """Remove a node copy directory, and the per-user root once it holds nothing more."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rmdir(node_copy_root())
    except OSError:
        pass  # another job's copy is still held, or there was none


# -- checkpoint steps ---------------------------------------------------------------------

def step_dir(ckpt_dir, step):
    return os.path.join(ckpt_dir, f"step-{int(step)}")


def rank_file_name(rank):
    return f"rank-{rank}.pt"


def rank_sidecar_name(rank):
    """`{"size", "sha256"}` of the rank's file, written after the file is complete: its
    presence is how the committing rank learns that this rank's part is durable."""
    return f"rank-{rank}.pt.json"


def rank_failure_name(rank, token):
    """Written by a rank whose persist failed in save round `token`, so the committing rank
    gives up at once instead of waiting out its timeout."""
    return f"rank-{rank}.failed-{token}"


def step_of(path):
    match = _STEP_DIR_NAME.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, text, mode=0o666, durable=False):
    """Write `text` (str or bytes) to `path` so that a reader, a second writer or a crash
    finds the old document or the new one, never a part of either: a temp file of a name no
    other writer uses (pid and thread) in the same directory, then a rename over `path`.
    `mode` is the new file's, less the umask (0o600 for files that hold a token). With
    `durable`, the file and the directory are fsynced too, for what must survive a power
    cut (checkpoint manifests); without, a kill -9 at any point is covered, which is what
    the launcher's and the nodes' own records need. A kill -9 between the two leaves a
    `.<name>.<pid>.<thread>.tmp` beside the file, which no reader opens."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = text.encode() if isinstance(text, str) else text
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    if durable:
        fsync_dir(directory)


def write_json(path, obj, mode=0o666, durable=False):
    """`obj` as JSON, written as `write_atomic` writes."""
    write_atomic(path, json.dumps(obj), mode, durable)


def write_json_atomic(path, obj):
    """write_json, durable: after a crash or a power cut the path holds either nothing, the
    old document or the whole new one."""
    write_json(path, obj, durable=True)


def read_json(path):
    """The parsed document, or None when it is missing or unreadable (a reader never sees a
    torn one from write_atomic, but a file from elsewhere may be anything)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_int(path):
    """The whole number a file holds, or None when it is missing or holds something else."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def write_manifest(step_path, step, world_size, files, replicated=False):
    """files: {name: {"size", "sha256"}}. Call only once every listed file is durable.
    `replicated`: every rank's file holds the same model and optimizer state (DDP), so the
    step may be restored by another number of ranks (a branch, launcher/branches.py)."""
    manifest = {"step": int(step), "world_size": int(world_size), "time": time.time(),
                "files": files, "replicated": bool(replicated)}
    write_json_atomic(os.path.join(step_path, MANIFEST), manifest)
    return manifest


def read_manifest(step_path):
    """The parsed manifest, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(step_path, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return None
    return manifest


def verify_step(step_path, deep=False):
    """True when the step is committed: manifest present and every file it lists has the
    listed size (and, with deep, the listed sha256)."""
    return _verified_manifest(step_path, deep) is not None


def file_mismatch(step_path, name, record, deep=False):
    """Why the step's file `name` is not what its manifest `record` ({"size", "sha256"}) lists,
    in a few words; None when it is (by size, and with deep by sha256 too)."""
    path = os.path.join(step_path, name)
    try:
        size = os.path.getsize(path)
        if size != record["size"]:
            return f"{size} bytes where its manifest lists {record['size']}"
        if deep:
            digest = sha256_of(path)
            if digest != record["sha256"]:
                return f"sha256 {digest[:16]} where its manifest lists {str(record['sha256'])[:16]}"
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    except (KeyError, TypeError):
        return "not listed in its manifest"
    return None


# A rank whose own file of the step it is to restore does not hash to what the manifest lists
# reports this event ({"step", "path", "file", "manifest_time", "message"}) and fails; the
# launcher then restarts from the newest step not reported so (launcher/checkpoints.py).
CHECKPOINT_CORRUPT = "checkpoint_corrupt"


def _verified_manifest(step_path, deep):
    manifest = read_manifest(step_path)
    if manifest is None or manifest.get("step") != step_of(step_path):
        return None
    for name, record in manifest["files"].items():
        if file_mismatch(step_path, name, record, deep) is not None:
            return None
    return manifest


def step_dirs(ckpt_dir):
    """{step: path} of every step directory, committed or not."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        step = step_of(name)
        if step is not None:
            found[step] = os.path.join(ckpt_dir, name)
    return found


def committed_steps(ckpt_dir):
    """[{"step", "path", "time", "size", "world_size"}] of verified steps, oldest first."""
    records = []
    for step, path in sorted(step_dirs(ckpt_dir).items()):
        manifest = _verified_manifest(path, deep=False)
        if manifest is not None:
            records.append({
                "step": step,
                "path": path,
                "time": manifest.get("time"),
                "size": sum(r["size"] for r in manifest["files"].values()),
                "world_size": manifest.get("world_size"),
            })
    return records


def latest_committed(ckpt_dir):
    """The newest committed step's record, or None."""
    steps = committed_steps(ckpt_dir)
    return steps[-1] if steps else None


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
