"""The message protocol between the caller's `RenderPool`, its sandbox workers and their render children.

Every message is a frame: a 4-byte big-endian length, a JSON header of that length, then `header["nbytes"]` raw
bytes of payload (an RGB image, or nothing). Requests from the caller are headers alone (the source is a JSON
string in them); replies carry `ok`, a `reason` when not ok, the request `id`, and the pixels. JSON and raw bytes,
never pickle: a pickle from a compromised process would run code in the reader. Readers bound what they wait for
and allocate (`MAX_HEADER`, the expected image size), so a hostile writer can make a frame fail, never a reader hang
or blow up.

Imports only the standard library: the worker program (`sandbox.py`) loads this file by path, without the `rewards`
package (and torch).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

KINDS = ("svg", "chart", "cad", "html")
"""Renderers this sandbox runs: `svg` (cairosvg), `chart` (matplotlib code), `cad` (build123d scripts) and `html`
(headless Chromium, driven by the worker itself: see `rewards.render.html`)."""

FRAME = struct.Struct(">I")
"""The length prefix of every frame: the JSON header's size in bytes."""

MAX_HEADER = 1 << 16
"""Largest JSON header a reader accepts, in bytes."""

_MAX_REASON = 300


def take_frame(buf: bytearray, max_payload: int) -> tuple[dict[str, Any], bytes] | None:
    """Removes and returns one `[length][JSON header][payload]` frame from `buf`, or None if it is incomplete.

    The header's `nbytes` gives the payload length. Raises ValueError on anything malformed or oversized, so a
    reader never waits for, or allocates, more than `max_payload` plus a small header.
    """
    if len(buf) < FRAME.size:
        return None
    (length,) = FRAME.unpack_from(buf)
    if length > MAX_HEADER:
        raise ValueError(f"header of {length} bytes")
    if len(buf) < FRAME.size + length:
        return None
    try:
        header = json.loads(bytes(buf[FRAME.size : FRAME.size + length]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise ValueError("header is not JSON") from e
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    nbytes = header.get("nbytes", 0)
    if type(nbytes) is not int or not 0 <= nbytes <= max_payload:
        raise ValueError(f"payload size {nbytes!r}")
    end = FRAME.size + length + nbytes
    if len(buf) < end:
        return None
    payload = bytes(buf[FRAME.size + length : end])
    del buf[:end]
    return header, payload


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One frame: `header` (with `nbytes` set to the payload's length) and `payload`."""
    body = json.dumps({**header, "nbytes": len(payload)}).encode()
    return FRAME.pack(len(body)) + body + payload


def write_all(fd: int, data: bytes) -> None:
    """Writes all of `data` to a blocking descriptor."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, n: int) -> bytes | None:
    """Reads exactly `n` bytes from a blocking descriptor; None at end of file."""
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def clean_reason(reason: object) -> str:
    """A reason safe to show and log: printable characters only, at most 300 of them."""
    text = str(reason)
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def send(fd: int, header: dict[str, Any], payload: bytes = b"") -> None:
    """Writes one frame (its reason cleaned); a closed pipe is ignored, since nobody is left to tell."""
    try:
        if "reason" in header:
            header = {**header, "reason": clean_reason(header["reason"])}
        write_all(fd, frame(header, payload))
    except OSError:
        pass
