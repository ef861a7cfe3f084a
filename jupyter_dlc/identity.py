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
