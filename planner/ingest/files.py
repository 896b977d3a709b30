"""Reading input files within limits: checked paths, bounded streaming gunzip, sniff heads.

Every reader goes through here, so one place decides what an input may be:

- a regular file (a FIFO, socket or device is refused from `stat`, never opened);
- a name that is UTF-8 with no component over 255 bytes (it is shown in messages and
  may become part of an output name);
- content (the file, or what a gzip inflates to) of at most `max_decompressed()` bytes,
  counted as the stream is read, one piece at a time, so a gzip bomb costs one piece of
  memory and stops at the limit; a gzip inflating more than `max_gzip_ratio()` times
  (past 64 MiB) stops there, long before the limit;
- when parsed whole (protobuf, planner JSON, Execution Trace), at most `max_document()`
  bytes, since a parsed document costs several times its size in memory.

Each refusal is one `InputError` line naming the limit and the variable that raises it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from planner.errors import InputError

try:  # ISA-L inflates Kineto's gzip ~3x faster than zlib (a quarter of reading a rank)
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _IsalError

    _GZIP_ERRORS: tuple[type[Exception], ...] = (EOFError, zlib.error, _IsalError, gzip.BadGzipFile)
except ImportError:  # pragma: no cover - isal is a dependency; the standard gzip is the fallback
    _gzip = gzip  # type: ignore[misc]
    _GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)

MAX_DECOMPRESSED = 8 << 30
"""Content (a plain file's size, or what a gzip inflates to) above this is refused.

``PLANNER_MAX_DECOMPRESSED`` (bytes) overrides it, read at every call (`max_decompressed`)."""

MAX_DOCUMENT = 1 << 30
"""An input parsed whole in memory (protobuf, planner JSON, Execution Trace, a Kineto file
outside the streaming layout) above this is refused; ``PLANNER_MAX_DOCUMENT`` overrides it."""

MAX_GZIP_RATIO = 200
"""A gzip that has inflated more than this many times its compressed bytes, past
RATIO_FLOOR, is refused as a bomb: real traces compress 5-50x (the most compressible of
the shared traces: 50x). ``PLANNER_MAX_GZIP_RATIO`` overrides it."""

RATIO_FLOOR = 64 << 20
"""Decompressed bytes before the ratio is judged (small, very regular files pass)."""

MAX_NAME_BYTES = 255
"""The longest path component (bytes) accepted: the common file-system limit."""

MAX_SPAN_S = 86_400.0
"""An op or iteration longer than a day is refused: wrong time units or a broken clock."""

MAX_NBYTES = 1 << 50
"""A transfer larger than 1 PiB is refused: a broken size field."""

MAX_TIME_NS = 1 << 62
"""Absolute times (ns) must lie in [0, 2**62) (until the year 2116): int64 arithmetic."""

GZIP_MAGIC = b"\x1f\x8b"

STREAM_PIECE = 1 << 16
"""Bytes inflated at a time: the memory a gzip stream costs beyond its consumer."""

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _env_limit(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(None, f"{name}={raw!r} is not a byte count") from None
    if value <= 0:
        raise InputError(None, f"{name}={raw!r} must be positive")
    return value


def max_decompressed() -> int:
    """The content limit in bytes: ``PLANNER_MAX_DECOMPRESSED`` or MAX_DECOMPRESSED."""
    return _env_limit("PLANNER_MAX_DECOMPRESSED", MAX_DECOMPRESSED)


def max_document() -> int:
    """The limit for inputs parsed whole: ``PLANNER_MAX_DOCUMENT`` or MAX_DOCUMENT."""
    return _env_limit("PLANNER_MAX_DOCUMENT", MAX_DOCUMENT)


def max_gzip_ratio() -> int:
    """The inflation ratio limit: ``PLANNER_MAX_GZIP_RATIO`` or MAX_GZIP_RATIO."""
    return _env_limit("PLANNER_MAX_GZIP_RATIO", MAX_GZIP_RATIO)


def size_text(size: int) -> str:
    """`size` bytes in the largest binary unit it reaches ('16 MiB', '1.5 GiB')."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.3g} {unit}"
    return f"{size} bytes"


def shown(path: str | Path) -> str:
    """The path as it can be printed: bytes that are not UTF-8 as \\x escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_name(path: Path) -> None:
    """Refuse a path that is not UTF-8 or has a component over MAX_NAME_BYTES bytes."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(shown(path), "file name is not UTF-8; rename it") from None
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise InputError(
            f"{shown(path.parent)}/{shown(path.name)[:40]}...",
            f"a path component is {longest} bytes, over the {MAX_NAME_BYTES}-byte limit",
        )


def check_path(path: Path) -> os.stat_result:
    """The `stat` of an input that may be read: named well, a regular file or a directory.

    FIFOs, sockets and devices are refused here, before anything opens them (a FIFO
    would block, `/dev/zero` never ends). A plain file over `max_decompressed()` is
    refused from its size.
    """
    check_name(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        return info
    for test, what in _NOT_REGULAR:
        if test(info.st_mode):
            raise InputError(path, f"is {what}, not a regular file; refused without reading it")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, "is not a regular file; refused without reading it")
    limit = max_decompressed()
    if info.st_size > limit:
        raise InputError(
            path,
            f"is {size_text(info.st_size)}, over the {size_text(limit)} input limit "
            "(raise PLANNER_MAX_DECOMPRESSED to allow it)",
        )
    return info


def _over(path: Path, limit: int, variable: str, whole: bool) -> InputError:
    if whole:
        return InputError(
            path,
            f"is more than {size_text(limit)}, the limit for inputs read whole "
            f"(raise {variable} to allow it)",
        )
    return InputError(
        path,
        f"decompresses to more than {size_text(limit)} (a gzip bomb? raise {variable} to allow it)",
    )


def iter_content(path: Path, piece: int = STREAM_PIECE) -> Iterator[bytes]:
    """The (gunzipped) content in pieces of at most `piece` bytes, within the limit.

    Memory is one piece plus zlib's window, whatever the file inflates to; past
    `max_decompressed()` an InputError names the limit. Broken gzip data is an InputError.
    """
    info = check_path(path)
    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, "is a directory")
    limit = max_decompressed()
    ratio = max_gzip_ratio()
    total = 0
    try:
        with path.open("rb") as handle:
            stream: Any = handle
            packed = handle.read(2) == GZIP_MAGIC
            handle.seek(0)
            if packed:
                stream = _gzip.GzipFile(fileobj=handle)
            while chunk := stream.read(piece):
                total += len(chunk)
                if total > limit:
                    raise _over(path, limit, "PLANNER_MAX_DECOMPRESSED", whole=False)
                if packed and total > RATIO_FLOOR and total > ratio * handle.tell():
                    raise InputError(
                        path,
                        f"inflates more than {ratio} times ({size_text(total)} from "
                        f"{size_text(handle.tell())} so far; traces compress 5-50x): a gzip "
                        "bomb? raise PLANNER_MAX_GZIP_RATIO to allow it",
                    )
                yield chunk
    except _GZIP_ERRORS as exc:
        raise InputError(path, f"broken gzip data ({exc})") from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def check_document_size(path: Path, size: int) -> None:
    """Refuse content of `size` bytes (already counted) that is too big to read whole."""
    limit = max_document()
    if size > limit:
        raise _over(path, limit, "PLANNER_MAX_DOCUMENT", whole=True)


def read_bytes(path: Path) -> bytes:
    """The whole (gunzipped) content, for inputs parsed whole; InputError when too big.

    Bounded by both limits: `max_decompressed()` as the stream is read and
    `max_document()` for what is held, so memory never exceeds the smaller one.
    """
    document = max_document()
    content = max_decompressed()
    out = io.BytesIO()
    for chunk in iter_content(path, 1 << 20):
        out.write(chunk)
        if out.tell() > document:
            if document >= content:  # pragma: no cover - iter_content refuses first
                break
            raise _over(path, document, "PLANNER_MAX_DOCUMENT", whole=True)
    return out.getvalue()


def read_head(path: Path, size: int = 1 << 16) -> bytes:
    """The first `size` bytes of the (decompressed) content, for sniffing the format.

    A gzip too short to yield anything is an error; one that breaks later is left for
    the full read to report.
    """
    check_path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(size)
            if raw[:2] != GZIP_MAGIC:
                return raw
            handle.seek(0)
            with gzip.GzipFile(fileobj=handle) as stream:
                return stream.read(size)
    except _GZIP_ERRORS as exc:
        raise InputError(path, f"broken gzip data ({exc})") from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def escape_invalid_utf8(data: bytes) -> tuple[bytes, int]:
    """`data` with each byte that is no part of valid UTF-8 written as the JSON text
    ``\\\\xNN`` (which reads back as the four characters ``\\xNN``), and how many
    there were: a name a profiler wrote in Latin-1 is read, shown escaped and noted,
    where decoding it would fail. `data` itself when it is valid UTF-8."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        text, count = _STRAY_BYTE.subn(
            lambda m: f"\\\\x{ord(m.group()) - 0xDC00:02x}",
            data.decode("utf-8", "surrogateescape"),
        )
        return text.encode("utf-8"), count
    return data, 0


_STRAY_BYTE = re.compile("[\udc80-\udcff]")
"""A byte `surrogateescape` could not decode (U+DC80..U+DCFF stand for bytes 0x80..0xFF)."""


def escaped_note(count: int) -> str:
    """The note on a trace whose text held `count` bytes that are not UTF-8."""
    return (
        f"{count} byte(s) of the trace's text are not UTF-8 (a name written in another "
        "encoding): read escaped, as \\xNN"
    )


def parse_json_escaped(path: Path, data: bytes) -> tuple[Any, int]:
    """(`data` as JSON, how many of its bytes were not UTF-8 and were read escaped by
    `escape_invalid_utf8`); one InputError for invalid or too deeply nested text, or a
    number too long to read.

    A ``\\uDxxx`` escape that is not half of a pair would give a string no output can
    encode: refused here, naming it (the walk runs only when such an escape is present).
    """
    count = 0
    try:
        try:
            document = loads_unterminated(json.loads, data, json.JSONDecodeError)
        except UnicodeDecodeError:
            data, count = escape_invalid_utf8(data)
            document = loads_unterminated(json.loads, data, json.JSONDecodeError)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON ({exc})") from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply (more than about 1000 levels)") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InputError(path, f"a number no trace holds ({exc})") from None
    if _SURROGATE_ESCAPE.search(data):
        lone = first_lone_surrogate(document)
        if lone is not None:
            raise InputError(path, f"a string holds a lone surrogate, not Unicode text: {lone!a}")
    return document, count


_CLOSERS = {b"[": (b"]",), b"{": (b"}", b"]}")}
"""What an unterminated chrome trace may lack, by its first byte: a JSON array its ``]``
(the Trace Event Format allows it; Horovod never writes it), the object form its ``}``
or the ``]}`` that close its ``traceEvents`` array last."""


def unterminated_closings(data: bytes) -> Iterator[bytes]:
    """`data` closed each way of `_CLOSERS` (a trailing comma dropped), when it is a JSON
    array that does not end with its ``]``, or a chrome-trace object (``traceEvents`` in
    its first 64 KiB; its last event may end it with a ``}``); nothing else: any other
    JSON document (a planner trace) cut short stays invalid."""
    body = data.rstrip()
    first = body.lstrip()[:1]
    closers = _CLOSERS.get(first, ())
    if first == b"[" and body.endswith(b"]"):
        return
    if first == b"{" and b'"traceEvents"' not in body[:65536]:
        return
    if body.endswith(b","):
        body = body[:-1].rstrip()
    for closer in closers:
        yield body + closer


def loads_unterminated(
    loads: Callable[[bytes], Any],
    data: bytes,
    errors: type[Exception] | tuple[type[Exception], ...],
) -> Any:
    """``loads(data)``; when that fails on a text left unterminated (`unterminated_closings`),
    once more per way of closing it. The first error stands when none parses: the normal
    path costs nothing more, a failing one a parse or two."""
    try:
        return loads(data)
    except errors as exc:
        first = exc
    for closed in unterminated_closings(data):
        try:
            return loads(closed)
        except errors:
            continue
    raise first


def first_lone_surrogate(document: Any) -> str | None:
    """The first string (key or value) in `document` that is not encodable UTF-8, or None."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item[:60]
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
