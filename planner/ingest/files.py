"""Reading input files: transparent, bounded gunzip, and cheap heads for sniffing."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

from planner.errors import InputError

MAX_DECOMPRESSED = 8 << 30
"""A file that decompresses to more than this is refused (a gzip bomb, or no trace)."""

GZIP_MAGIC = b"\x1f\x8b"


def _raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it is gzip; InputError when broken or too big."""
    raw = _raw(path)
    if raw[:2] != GZIP_MAGIC:
        return raw
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            while chunk := stream.read(1 << 22):
                out.write(chunk)
                if out.tell() > MAX_DECOMPRESSED:
                    limit = MAX_DECOMPRESSED >> 30
                    raise InputError(path, f"decompresses to more than {limit} GiB")
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
