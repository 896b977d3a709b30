"""`planner.ingest.exact_json`: JSON read with its integers exact (issue #47).

orjson reads an integer past 64 bits as a float, which turned an id of 10**30 into "no
id" and a rank of -2**63-1 into no rank; an integer past 4300 digits no parser holds.
"""

from __future__ import annotations

import pytest

from planner.ingest.exact_json import JSONError, LongInt, loads, number_text


@pytest.mark.parametrize(
    "value",
    [2**63, 10**30, -(2**63) - 1, 2**64, -(10**4000)],
    ids=["2p63", "1e30", "neg-2p63", "2p64", "neg-1e4000"],
)
def test_integers_past_int64_are_read_exact(value: int) -> None:
    assert loads(f'{{"id": {value}}}'.encode()) == {"id": value}
    assert type(loads(str(value).encode())) is int


def test_an_integer_past_4300_digits_is_refused_unless_long_ints_are_asked_for() -> None:
    text = b'{"n": -' + b"9" * 5000 + b', "x": [1.5, "a"]}'
    with pytest.raises(JSONError):
        loads(text)
    found = loads(text, long_ints=True)
    assert isinstance(found["n"], LongInt) and found["x"] == [1.5, "a"]
    assert found["n"] < -(2**63) and not -(2**62) < found["n"] < 2**62
    assert str(found["n"]) == f"{found['n']}" == "-99999999999999999999...(5000 digits)"
    assert number_text(found["n"]) == str(found["n"])


@pytest.mark.parametrize(
    "text",
    [b"[1e400, " + b"9" * 5000 + b"]", b"[NaN, " + b"9" * 5000 + b"]",
     b'["\\ud800", ' + b"9" * 5000 + b"]", b"[" + b"9" * 5000 + b",]"],
    ids=["float-past-double", "nan", "lone-surrogate", "trailing-comma"],
)  # fmt: skip
def test_what_no_parser_reads_stays_refused_beside_a_long_integer(text: bytes) -> None:
    with pytest.raises(JSONError):
        loads(text, long_ints=True)


def test_what_msgspec_refuses_is_worded_by_orjson() -> None:
    with pytest.raises(JSONError, match="trailing|after document"):
        loads(b'{"a": 1} x')
    assert loads(b"[" * 1000 + b"]" * 1000) is not None  # past msgspec's recursion, in orjson's


def test_number_text_stays_short() -> None:
    assert number_text(10**30) == "1000000000000000000000000000000"
    assert number_text(-(10**100)) == "-1000000000000000000...(101 digits)"
    assert number_text(1e30) == "1e+30"
