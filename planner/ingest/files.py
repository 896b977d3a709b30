"""Reading input files: transparent, bounded gunzip, and cheap heads for sniffing."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path

from planner.errors import InputError

MAX_DECOMPRESSED = 8 << 30
"""A file that decompresses to more than this is refused (a gzip bomb, or no trace).

The environment variable ``PLANNER_MAX_DECOMPRESSED`` (bytes) overrides it, read at
every call (see `max_decompressed`)."""

MAX_SPAN_S = 86_400.0
"""An op or iteration longer than a day is refused: wrong time units or a broken clock."""

MAX_NBYTES = 1 << 50
"""A transfer larger than 1 PiB is refused: a broken size field."""

MAX_TIME_NS = 1 << 62
"""Absolute times (ns) must lie in [0, 2**62) (until the year 2116): int64 arithmetic."""

GZIP_MAGIC = b"\x1f\x8b"


def _raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def max_decompressed() -> int:
    """The decompression limit in bytes: ``PLANNER_MAX_DECOMPRESSED`` or MAX_DECOMPRESSED."""
    raw = os.environ.get("PLANNER_MAX_DECOMPRESSED", "").strip()
    if not raw:
        return MAX_DECOMPRESSED
    try:
        value = int(raw)
    except ValueError:
        raise InputError(None, f"PLANNER_MAX_DECOMPRESSED={raw!r} is not a byte count") from None
    if value <= 0:
        raise InputError(None, f"PLANNER_MAX_DECOMPRESSED={raw!r} must be positive")
    return value


def _limit_text(limit: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift:
            return f"{limit / (1 << shift):g} {unit}"
    return f"{limit} bytes"


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it is gzip; InputError when broken or too big."""
    raw = _raw(path)
    if raw[:2] != GZIP_MAGIC:
        return raw
    out = io.BytesIO()
    limit = max_decompressed()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            while chunk := stream.read(min(1 << 22, limit + 1 - out.tell())):
                out.write(chunk)
                if out.tell() > limit:
                    raise InputError(
                        path,
                        f"decompresses to more than {_limit_text(limit)} (a gzip bomb? "
                        "raise PLANNER_MAX_DECOMPRESSED to allow it)",
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"broken gzip data ({exc})") from None
    return out.getvalue()


def read_head(path: Path, size: int = 1 << 16) -> bytes:
    """The first `size` bytes of the (decompressed) content, for sniffing the format.

    A gzip too short to yield anything is an error; one that breaks later is left for
    the full read to report.
    """
    raw = b""
    try:
        with path.open("rb") as handle:
            raw = handle.read(size)
            if raw[:2] != GZIP_MAGIC:
                return raw
            handle.seek(0)
            with gzip.GzipFile(fileobj=handle) as stream:
                return stream.read(size)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(path, f"broken gzip data ({exc})") from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
