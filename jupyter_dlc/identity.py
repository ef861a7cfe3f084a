"""The launcher's identity: how ranks, node reporters and clients know that what answers on
the launcher's port is their launcher (ARCHITECTURE.md, "Tokens and the launcher's identity").

Stdlib only, imports nothing of ours: ranks, node reporters, the client and the launcher use
it alike.

A launcher keeps a secret in its data dir (`launcher.identity`, 0600), made once and kept
across restarts, so jobs started by one launcher still verify the next. It never leaves the
launcher. From it come keys, one per audience:

- the client key, in the connection file (0600): clients check /healthz with it before they
  send the launcher token;
- a job key per job, in the ranks' environment (`DLC_LAUNCHER_PROOF`): ranks and node
  reporters check every report answer with it. It is not derived from the job token, which
  a rank sends with every report (to whatever holds the port); and it proves the launcher
  to that job's ranks only.

A request carries a fresh nonce (`X-DLC-Nonce`); the answer carries `X-DLC-Proof`, an HMAC
of the method, the path, the nonce, the request body's digest, the status and the answer
body. Something on the port that holds no key cannot make one, nor replay an old one (the
nonce is new each time), nor turn a real answer to another request into one for this
request (the request's body is in it).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from typing import NamedTuple

NONCE_HEADER = "X-DLC-Nonce"
PROOF_HEADER = "X-DLC-Proof"
# Which run of the launcher answered (its pid): every run of a data dir proves the same
# identity, so a client tells by this whether its connection file is that run's or stale.
PID_HEADER = "X-DLC-Pid"
# The job key in a job's environment (DLC_LAUNCHER_KEY is taken: the TLS key file).
KEY_ENV = "DLC_LAUNCHER_PROOF"
SECRET_FILE = "launcher.identity"


def launcher_secret(data_dir: str) -> bytes:
    """The data dir's launcher secret, made on first use (0600, never replaced)."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    with open(path) as f:
        text = f.read().strip()
    if len(text) != 64:
        raise OSError(f"{path}: not a launcher identity (64 hex digits); delete it to make a new "
                      "one (running jobs then no longer recognise their launcher)")
    return bytes.fromhex(text)


def _derive(secret: bytes, purpose: str) -> str:
    return hmac.new(secret, purpose.encode(), hashlib.sha256).hexdigest()


def client_key(secret: bytes) -> str:
    return _derive(secret, "client")


def job_key(secret: bytes, job_id: str) -> str:
    return _derive(secret, f"job\0{job_id}")


def digest(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def proof(key: str, method: str, path: str, nonce: str, request_digest: str, status: int,
          answer: bytes) -> str:
    message = "\n".join(("dlc-proof-1", method.upper(), path, nonce, request_digest, str(status),
                         digest(answer)))
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(16)


class Answer(NamedTuple):
    status: int
    body: bytes
    proven: bool    # the answer proves the key's holder (always True without a key)
    pid: int | None = None  # PID_HEADER: which run of the launcher answered


def exchange(url: str, method: str = "GET", data: bytes | None = None,
             headers: dict[str, str] | None = None, key: str | None = None,
             timeout: float = 3.0, context=None) -> Answer:
    """One request, whatever its status, and whether its answer proves `key`. Raises what
    urllib raises when nothing answers (URLError, OSError, TimeoutError)."""
    nonce = new_nonce()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={**(headers or {}), NONCE_HEADER: nonce})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status, body, answered = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, body, answered = error.code, error.read(), error.headers
    said = answered.get(PID_HEADER) or ""
    pid = int(said) if said.isdigit() else None
    if key is None:
        return Answer(status, body, True, pid)
    path = urllib.parse.urlsplit(url).path or "/"
    expected = proof(key, method, path, nonce, digest(data), status, body)
    return Answer(status, body, hmac.compare_digest(expected, answered.get(PROOF_HEADER) or ""), pid)


class Channel:
    """POSTs to one URL over one HTTP/1.1 connection kept open between requests (where the
    server keeps it: tornado, the node reporter), with what `exchange` checks. For a sender
    in a training process: each request is one send and (mostly) one receive, where urllib
    opens a connection and parses its answer through the email package, many GIL hand-overs
    with the training thread a request. Raises as sockets do (ConnectionRefusedError,
    TimeoutError, OSError) and ValueError on an answer that is not HTTP. Not thread-safe."""

    MAX_HEAD = 64 << 10

    def __init__(self, url: str, context=None):
        parts = urllib.parse.urlsplit(url)
        self.https = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.path = parts.path or "/"
        self.context = (context or ssl_default()) if self.https else None  # as urllib: http ignores it
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._head = f"POST {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
        self._sock = None
        self._timeout: float | None = None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def post(self, data: bytes, headers: dict[str, str], key: str | None, timeout: float) -> Answer:
        nonce = new_nonce()
        head = self._head + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = (f"{head}{NONCE_HEADER}: {nonce}\r\nContent-Length: {len(data)}\r\n\r\n"
                   .encode("latin-1") + data)
        reused = self._sock is not None
        try:
            status, answered, body = self._exchange(request, timeout)
        except (ConnectionResetError, BrokenPipeError, _Closed):
            if not reused:
                raise
            # The server closed the kept connection while it was idle (it restarted): it
            # never read this request. Once more on a new connection.
            status, answered, body = self._exchange(request, timeout)
        said = answered.get(PID_HEADER.lower()) or ""
        pid = int(said) if said.isdigit() else None
        if key is None:
            return Answer(status, body, True, pid)
        expected = proof(key, "POST", self.path, nonce, digest(data), status, body)
        return Answer(status, body, hmac.compare_digest(expected, answered.get(PROOF_HEADER.lower()) or ""), pid)

    def _exchange(self, request: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        try:
            sock = self._sock
            if sock is None:
                sock = self._sock = self._connect(timeout)
                self._timeout = timeout
            elif timeout != self._timeout:
                sock.settimeout(timeout)
                self._timeout = timeout
            sock.sendall(request)
            status, answered, body, keep = self._read(sock)
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return status, answered, body

    def _connect(self, timeout: float):
        import socket

        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def _read(self, sock) -> tuple[int, dict[str, str], bytes, bool]:
        buffer = b""
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buffer) > self.MAX_HEAD:
                raise ValueError("answer headers too long")
            chunk = sock.recv(65536)
            if not chunk:
                raise _Closed() if not buffer else ValueError("answer cut short")
            buffer += chunk
        lines = buffer[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
        status = int(rest[:3])
        answered: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            answered[name.strip().lower()] = value.strip()
        body = buffer[end + 4:]
        keep = version == "HTTP/1.1" and answered.get("connection", "").lower() != "close"
        if "chunked" in answered.get("transfer-encoding", "").lower():
            body, keep = self._read_chunked(sock, body), False  # trailers are not read
        elif "content-length" in answered:
            length = int(answered["content-length"])
            while len(body) < length:
                chunk = sock.recv(max(65536, length - len(body)))
                if not chunk:
                    raise ValueError("answer cut short")
                body += chunk
            body = body[:length]
        elif status >= 200 and status not in (204, 304):
            keep = False  # the body ends where the server closes
            while chunk := sock.recv(65536):
                body += chunk
        return status, answered, body, keep

    def _read_chunked(self, sock, buffer: bytes) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in buffer:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ValueError("answer cut short")
                buffer += chunk
            size_line, buffer = buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buffer) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ValueError("answer cut short")
                buffer += chunk
            if size == 0:
                return body
            body, buffer = body + buffer[:size], buffer[size + 2:]


class _Closed(ConnectionResetError):
    """The server closed the connection before answering."""


def ssl_default():
    import ssl

    return ssl.create_default_context()
