"""Length-prefixed pickles over a socket pair: how the launcher, its ingest worker and the
worker's retention analysis talk (ingest_worker.py, retention_process.py). Each end is a
process we started ourselves on a socket pair nobody else holds, so a pickle is safe here."""

from __future__ import annotations

import pickle
import struct
from typing import Any

_HEAD = struct.Struct("!I")


def frame(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(payload)) + payload


class Frames:
    """Messages out of a byte stream fed in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        out = []
        while len(self._buffer) >= _HEAD.size:
            (size,) = _HEAD.unpack_from(self._buffer)
            end = _HEAD.size + size
            if len(self._buffer) < end:
                break
            out.append(pickle.loads(self._buffer[_HEAD.size:end]))
            del self._buffer[:end]
        return out
