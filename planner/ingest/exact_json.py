"""JSON text read with its integers exact: the ids, sizes and ranks of Kineto traces.

orjson, the fast parser, reads an integer literal outside [-2**63, 2**64) as a float: an
id of 10**30 would read as a float (no id) and a rank of -2**63-1 as no rank, so a value
past int64 would be accepted where it must be refused. msgspec, as fast, keeps every
integer of up to 4300 digits exact (`loads`); orjson still words whatever msgspec cannot
read. An integer of more digits (past Python's limit on turning text into an int) is no
number any reader holds, but in an event's args it may be a name or a field nobody uses:
`loads(raw, long_ints=True)` reads it as a `LongInt`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

try:  # orjson parses Kineto JSON ~2-3x faster with less peak memory than json
    import orjson as fast

    JSONError: tuple[type[Exception], ...] = (fast.JSONDecodeError,)
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json as fast  # type: ignore[no-redef]

    JSONError = (ValueError,)

_DECODER = msgspec.json.Decoder()
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # the standard library reads lone ones
_HUGE = 10**4300
_UNREAD = object()


class LongInt(int):
    """An integer literal of more than 4300 digits. Held as +-10**4300, beyond every range
    the readers accept, and printed by its first digits, so a message naming it cannot fail
    (Python refuses to print an int of more than 4300 digits)."""

    text: str

    def __new__(cls, literal: str) -> LongInt:
        negative = literal.startswith("-")
        self = super().__new__(cls, -_HUGE if negative else _HUGE)
        digits = len(literal) - negative
        self.text = f"{literal[: 20 + negative]}...({digits} digits)"
        return self

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return self.text


def number_text(value: int | float) -> str:
    """`value` for a message: at most 40 characters, however many digits it has."""
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text.lstrip('-'))} digits)"


def loads(raw: bytes | bytearray, long_ints: bool = False) -> Any:
    """The JSON value of `raw`, its integers exact.

    Raises `JSONError` (orjson's wording) when it is no JSON; bytes that are not UTF-8 or
    nesting past the recursion limit are left to orjson too. `long_ints`: an integer of
    more than 4300 digits is read as a `LongInt` instead of refused.
    """
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError:  # a number past msgspec's range: 4300 digits, a double
        if long_ints:
            found = _long_loads(raw)
            if found is not _UNREAD:
                return found
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        pass
    return fast.loads(raw)


def _long_loads(raw: bytes | bytearray) -> Any:
    """`raw` read by the standard library with its long integers as `LongInt`; `_UNREAD`
    when it holds anything else msgspec and orjson refuse (a float past a double, NaN,
    an escaped surrogate) or is no JSON: orjson then words the problem."""
    if _SURROGATE.search(raw):
        return _UNREAD
    try:
        return json.loads(
            bytes(raw).decode("utf-8"),
            parse_int=_int,
            parse_float=_finite,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError):
        return _UNREAD


def _int(literal: str) -> int:
    try:
        return int(literal)
    except ValueError:  # more digits than Python turns into an int
        return LongInt(literal)


def _finite(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number is infinity when parsed as double")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value")
