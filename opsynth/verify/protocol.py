"""Messages between the pool and its workers: 4-byte big-endian length + UTF-8 JSON, on pipe file
descriptors reserved for the protocol (never fd 1 or 2, which task code may flood).

JSON rather than pickle: a reply is a few numbers and strings, and a worker runs untrusted code,
so the parent should never unpickle what comes back.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 256 * 1024 * 1024


class ProtocolClosed(EOFError):
    """The other end closed its pipe (a worker that died, or a parent that went away)."""


class ProtocolTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


def send(fd: int, msg: dict[str, Any]) -> None:
    data = json.dumps(msg).encode()
    buf = _HEADER.pack(len(data)) + data
    view = memoryview(buf)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact_blocking(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise ProtocolClosed("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd: int) -> dict[str, Any]:
    """Blocking read of one message (the worker side)."""
    (n,) = _HEADER.unpack(_read_exact_blocking(fd, _HEADER.size))
    if n > MAX_MESSAGE:
        raise ProtocolClosed(f"message of {n} bytes is too large")
    return json.loads(_read_exact_blocking(fd, n))


class Reader:
    """Incremental reader for the parent: polls with short timeouts so the caller can watch the
    worker (liveness, memory) between polls, and never blocks past a deadline."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def _try_parse(self) -> dict[str, Any] | None:
        if len(self.buf) < _HEADER.size:
            return None
        (n,) = _HEADER.unpack(self.buf[: _HEADER.size])
        if n > MAX_MESSAGE:
            raise ProtocolClosed(f"message of {n} bytes is too large")
        if len(self.buf) < _HEADER.size + n:
            return None
        data = bytes(self.buf[_HEADER.size : _HEADER.size + n])
        del self.buf[: _HEADER.size + n]
        return json.loads(data)

    def poll(self, timeout: float) -> dict[str, Any] | None:
        """Return one message if one is (or becomes) complete within ``timeout`` seconds."""
        msg = self._try_parse()
        if msg is not None:
            return msg
        end = time.monotonic() + max(0.0, timeout)
        while True:
            left = end - time.monotonic()
            if left < 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise ProtocolClosed("pipe closed")
            self.buf += chunk
            msg = self._try_parse()
            if msg is not None:
                return msg
