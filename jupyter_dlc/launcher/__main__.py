"""`python -m jupyter_dlc.launcher`: the per-user launcher service (127.0.0.1 unless told
to serve other hosts: `--host`, `--advertise-url`, TLS with `--certfile`/`--keyfile`)."""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import logging
import os
import re
import secrets
import signal
import socket
import ssl
import sys
import time
import urllib.parse

import tornado.httpserver
import tornado.ioloop

from .. import layout, paths
from .app import HEADER_LIMIT, Launcher, make_app
from .pacing import ReportPacer
from .retention import RetentionPolicy
from .storage import DiskGuard
from .store import Store
from .supervisor import Supervisor

SWITCH_INTERVAL = 0.001  # seconds a thread holds the GIL while another waits (main() says why)

# Tokens in what gets logged: query arguments (tornado logs the URI of every 4xx and 5xx)
# and Authorization headers in anything that echoes a request.
_TOKEN_IN_TEXT = re.compile(r"((?:[?&]|\b)token=|Authorization['\"]?:?\s*['\"]?(?:token|bearer)\s+)"
                            r"[^&\s'\",)]+",
                            re.IGNORECASE)
# Any query argument, its name as sent: tornado decodes names (`?tok%65n=` is `token`), so
# the name is decoded here too before it is judged.
_QUERY_ARGUMENT = re.compile(r"([?&;])([^=&;\s#'\"]*)=([^&;\s#'\",)]*)")


def _redact_argument(match: re.Match) -> str:
    name = urllib.parse.unquote_plus(urllib.parse.unquote_plus(match.group(2))).lower()
    return f"{match.group(1)}{match.group(2)}=[redacted]" if "token" in name else match.group(0)


def redact(text: str) -> str:
    return _TOKEN_IN_TEXT.sub(r"\1[redacted]", _QUERY_ARGUMENT.sub(_redact_argument, text))


class RedactTokens(logging.Filter):
    """Every log line leaves the launcher without a token in it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def make_private(data_dir: str) -> None:
    """Owner-only modes on the data dir and what is in it, whatever the umask was when they
    were made (the client creates the dir and the log before the launcher runs)."""
    os.chmod(data_dir, 0o700)
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if os.path.islink(path):
            continue
        os.chmod(path, 0o700 if os.path.isdir(path) else 0o600)
    jobs = os.path.join(data_dir, "jobs")
    if os.path.isdir(jobs):
        for name in os.listdir(jobs):
            if not os.path.islink(os.path.join(jobs, name)):
                os.chmod(os.path.join(jobs, name), 0o700)


def write_connection_file(path: str, info: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    layout.write_json(path, info, mode=0o600)  # it holds the token


def _read_port(port_file: str) -> int | None:
    try:
        with open(port_file) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def moved_port(last: int | None, port: int, asked: int) -> str | None:
    """A launcher that could not come back on its data dir's last port says so: the ranks
    of jobs it adopts report to that port, to whatever holds it now."""
    if asked or last is None or last == port:
        return None
    return (f"port {last}, this data dir's last, is taken; serving on {port}: running jobs "
            f"report to {last} and reach this launcher only once it serves there again")


def lost_jobs(store: Store, data_dir: str) -> str | None:
    """Job directories the store has no record of: a store that lost what it had (its -wal
    file deleted while a launcher ran, a copy restored from before). Every submit makes the
    directory before the row, and a delete removes both, so none should be left over."""
    jobs = os.path.join(data_dir, "jobs")
    try:
        found = {name for name in os.listdir(jobs) if os.path.isdir(os.path.join(jobs, name))}
    except OSError:
        return None
    missing = sorted(found - {row["id"] for row in store.job_rows()})
    if not missing:
        return None
    return (f"{len(missing)} job(s) in {jobs} have no record in {store.path} ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}): the store lost them (was its -wal or "
            "-journal file deleted or the file replaced while a launcher ran?); their "
            "directories are kept, but they are no longer listed nor supervised")


def bind(port: int, port_file: str, host: str = "127.0.0.1") -> socket.socket:
    """Listen on `port`, else on the port the last launcher had, else on a free one.

    Running ranks know the launcher by the URL they were started with; coming back on the
    same port is what lets their reports reach a restarted launcher.
    """
    candidates = [port]
    last = None if port else _read_port(port_file)
    if last is not None:
        candidates.insert(0, last)
    for candidate in candidates:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError:
            sock.close()
            continue
        sock.listen(128)
        with open(port_file, "w") as f:
            f.write(str(sock.getsockname()[1]))
        return sock
    raise OSError(f"launcher: port {port} is taken; choose another with --port")


log = logging.getLogger("jupyter_dlc.launcher")


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The server side of TLS when a certificate is configured (None: plain http)."""
    if not certfile:
        if keyfile:
            raise SystemExit("launcher: --keyfile without --certfile; give both, or neither")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as error:
        raise SystemExit(f"launcher: --certfile/--keyfile: cannot load {certfile} ({error})") from None
    return context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_dlc.launcher")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--data-dir", default=None)
    # In a cluster (`jupyter-dlc launcher manifest`): listen on every address, token from a Secret.
    # Serving other hosts (SSH hosts): an address they reach, the URL they use, and TLS.
    env = os.environ.get
    parser.add_argument("--host", default=env("DLC_LAUNCHER_HOST", "127.0.0.1"),
                        help="address to listen on ($DLC_LAUNCHER_HOST)")
    parser.add_argument("--advertise-url", default=env("DLC_LAUNCHER_ADVERTISE_URL"),
                        help="the URL ranks and clients use ($DLC_LAUNCHER_ADVERTISE_URL; default: "
                             "the listening address)")
    parser.add_argument("--certfile", default=env("DLC_LAUNCHER_CERT"),
                        help="TLS certificate (PEM) to serve https ($DLC_LAUNCHER_CERT)")
    parser.add_argument("--keyfile", default=env("DLC_LAUNCHER_KEY"),
                        help="the certificate's private key ($DLC_LAUNCHER_KEY)")
    parser.add_argument("--ca-file", default=env("DLC_LAUNCHER_CA"),
                        help="what clients and ranks trust for the certificate ($DLC_LAUNCHER_CA; "
                             "default: the certificate itself)")
    parser.add_argument("--connection-file", default=None)
    parser.add_argument("--metrics-cap", type=int, default=None,
                        help="metric points kept per job before older ones are downsampled "
                             "more coarsely (default: DLC_METRICS_CAP, else 2,000,000)")
    args = parser.parse_args(argv)
    # What the launcher writes is the owner's alone (dirs 0700, files 0600); the job's
    # processes get back the umask the launcher was started with.
    from ..engines import children

    children.CHILD_UMASK = os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactTokens())
    logging.getLogger("tornado.access").setLevel(logging.WARNING)  # reports arrive many times a second
    data_dir = os.path.abspath(args.data_dir or paths.data_dir())
    os.makedirs(data_dir, exist_ok=True)
    make_private(data_dir)
    # One launcher per data directory: a second one would supervise the same jobs twice.
    # Opened without truncating: what the holder wrote (its pid, its connection file) is how
    # clients name it when it does not answer (client.lock_holder).
    lock = os.open(os.path.join(data_dir, paths.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"launcher: another launcher already serves {data_dir}", file=sys.stderr)
        return 3
    conn_path = args.connection_file or paths.connection_file(data_dir)
    holder = json.dumps({"pid": os.getpid(), "connection_file": os.path.abspath(conn_path)}).encode()
    os.ftruncate(lock, 0)
    os.pwrite(lock, holder, 0)
    port_file = os.path.join(data_dir, "launcher.port")
    last_port = _read_port(port_file)
    sock = bind(args.port, port_file, args.host)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    ssl_context = tls_context(args.certfile, args.keyfile)
    ca_file = os.path.abspath(args.ca_file or args.certfile) if ssl_context else None
    scheme = "https" if ssl_context else "http"
    listened = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    url = (args.advertise_url or f"{scheme}://{listened}:{port}").rstrip("/")
    if not ssl_context and not _loopback(args.host):
        # The token then crosses the network in clear: only inside a cluster's own network
        # (a Kubernetes Service), never on a shared or public one.
        log.warning("WARNING: listening on %s:%d without TLS; tokens travel in clear text. "
                    "Bind 127.0.0.1 unless this runs inside a trusted cluster network, or "
                    "give --certfile/--keyfile.", args.host, port)
    token = os.environ.get("DLC_LAUNCHER_TOKEN") or secrets.token_urlsafe(24)
    store = Store(os.path.join(data_dir, "launcher.sqlite"), DiskGuard(data_dir))
    warnings = [w for w in (lost_jobs(store, data_dir), moved_port(last_port, port, args.port))
                if w]
    for warning in warnings:
        log.warning("WARNING: %s", warning)
    from ..engines import contract

    contract.launcher_url = url
    supervisor = Supervisor(store, data_dir, url, ca_file=ca_file)
    try:
        retention = RetentionPolicy.from_env(args.metrics_cap)
        pacer = ReportPacer.from_env()
    except ValueError as error:
        print(f"launcher: {error}", file=sys.stderr)
        return 2
    launcher = Launcher(store, supervisor, data_dir, token, retention, pacer, warnings)
    from .alerting import attach_alerts

    attach_alerts(supervisor)
    # Past max_header_size tornado closes the connection without an answer: room for every
    # legal request line, and a 414 from the app for longer ones (app.REQUEST_LINE_LIMIT).
    server = tornado.httpserver.HTTPServer(make_app(launcher), ssl_options=ssl_context,
                                           max_header_size=HEADER_LIMIT)
    server.add_sockets([sock])
    # Reports allocate millions of short-lived objects a minute: collections of the young
    # generation are made rarer, and what start-up built is frozen out of the collector, so
    # that no full pass walks it again (they were about a tenth of ingest's CPU).
    gc.set_threshold(10_000, 20, 20)
    gc.freeze()
    # The supervisor's thread and the read routes' executor run Python for tens of ms at a
    # time (a 4,096-rank tick); the event loop, which answers every report, waited up to the
    # default 5 ms switch interval for the GIL each time it wanted it back. At 1 ms the
    # 4,096-rank ingest p99 fell by about a third (benchmarks/HISTORY.md, 2026-12-05 23:19).
    sys.setswitchinterval(SWITCH_INTERVAL)
    supervisor.start()
    # `identity`: the key this launcher's /healthz proves (identity.py); a client checks it
    # before it sends the token, so that nothing else on this port ever gets the token.
    write_connection_file(conn_path, {"url": url, "token": token, "pid": os.getpid(),
                                      "data_dir": data_dir, "started": time.time(),
                                      "ca_file": ca_file, "identity": launcher.client_key})
    logging.info("launcher serving %s for %s", url, data_dir)
    loop = tornado.ioloop.IOLoop.current()

    def shutdown(*_):
        loop.add_callback_from_signal(loop.stop)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    try:
        loop.start()
    finally:
        supervisor.close()
        supervisor.release_cgroups()
        try:
            with open(conn_path) as f:
                if json.load(f).get("pid") == os.getpid():
                    os.unlink(conn_path)
        except (OSError, ValueError):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
