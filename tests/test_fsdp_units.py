"""FSDP per unit and step (issue #45, point 3): each unit's all-gathers and reduce-scatter,
their time and exposed time, counted from the raw JSON of the runs in
`traces/torch/fsdp` (gloo: an all-gather runs as ``gloo:all_gather``, a reduce-scatter as
``gloo:all_reduce``; FSDP2 names each call's unit in an ``FSDP::all_gather (<unit>)`` or
``FSDP::post_backward_reduce (<unit>)`` range, FSDP1 names none)."""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter

import pytest
from conftest import REPO, run_cli
from test_schemas import validate

FSDP = REPO / "traces" / "torch" / "fsdp"
UNIT = re.compile(r"^FSDP::(?:all_gather|post_backward_reduce) \((.*)\)$")
KIND = {"c10d::_allgather_base_": "all_gather", "c10d::allgather_": "all_gather",
        "c10d::_reduce_scatter_base_": "reduce_scatter"}  # fmt: skip
RECORD = {"gloo:all_gather": "all_gather", "gloo:all_reduce": "reduce_scatter"}


def _raw(path) -> tuple[Counter, Counter, dict]:
    """Per (step, unit, kind): the c10d calls; per (step, kind): the gloo records' ns;
    unit -> its unsharded bytes. A call's unit is the FSDP range around it, else (FSDP1)
    its bytes."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    world = doc["distributedInfo"]["world_size"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
             for e in events if e["name"].startswith("ProfilerStep#")]  # fmt: skip
    ranges = [e for e in events if UNIT.match(e["name"])]
    calls, records, sizes = Counter(), Counter(), {}
    for e in events:
        step = next((n for a, b, n in steps if a <= e["ts"] < b), None)
        if step is None:
            continue
        if e["name"] in RECORD and e["cat"] == "user_annotation":
            records[step, RECORD[e["name"]]] += round(e["dur"] * 1000)
        if e["name"] not in KIND:
            continue
        dims = e["args"]["Input Dims"]
        if e["name"] == "c10d::allgather_":  # one shard in a list
            nbytes = math.prod(dims[1][0]) * 4 * world
        else:
            nbytes = max(math.prod(dims[0]), math.prod(dims[1])) * 4
        around = [r for r in ranges if r["tid"] == e["tid"] and r["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= r["ts"] + r["dur"]]  # fmt: skip
        unit = UNIT.match(around[-1]["name"]).group(1) if around else f"{nbytes} B"
        calls[step, unit, KIND[e["name"]]] += 1
        sizes[unit] = nbytes
    return calls, records, sizes


@pytest.mark.parametrize("variant", ["fsdp2_prefetch", "fsdp2_units2", "fsdp1_noprefetch"])
def test_each_unit_has_its_collectives_time_and_exposed_time(
    variant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``metrics --json``: per rank, step and unit the all-gathers and reduce-scatters the
    raw calls hold, of the unit's bytes; per step and kind their time is the gloo records'
    (ns rounding aside); exposed within the time; units named as the trace names them."""
    code, out, err = run_cli(["metrics", FSDP / variant, "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    validate(document)
    f = document["fsdp"]
    for rank in ("rank0", "rank1"):
        calls, records, sizes = _raw(FSDP / variant / f"{rank}.json.gz")
        mine = [r for r in f["rows"] if r["rank"] == rank]
        ours = Counter()
        time = Counter()
        for r in mine:
            ours[r["iteration"], r["unit"], r["kind"]] += r["count"]
            time[r["iteration"], r["kind"]] += r["time"]
            assert 0 <= r["exposed"] <= r["time"]
        assert ours == calls
        for key, ns in records.items():
            assert abs(time[key] * 1e9 - ns) <= 60
        assert {u["unit"]: u["bytes"] for u in f["units"]} == sizes
    named = variant.startswith("fsdp2")
    assert {u["source"] for u in f["units"]} == {"trace" if named else "inferred"}
    for e in f["by_unit_kind_phase"]:
        assert e["hidden"] == pytest.approx(e["time"] - e["exposed"])
        assert e["kind"] != "reduce_scatter" or e["phase"] == "backward"
    code, out, err = run_cli(["metrics", FSDP / variant], capsys)
    assert code == 0 and "FSDP units" in out


def test_the_replay_of_each_recorded_fsdp_setting_is_within_5_percent() -> None:
    """The baseline an FSDP what-if would start from: each recorded setting (prefetch on
    and off, with and without resharding, five units or two, FSDP1 and FSDP2) replayed
    with its own op times predicts its measured step (busy time) within 5% (median over
    the ranks' steps)."""
    from planner.ingest import detect
    from planner.prediction.replay import replay

    for variant in sorted(p.name for p in FSDP.iterdir() if p.is_dir()):
        document = replay(detect.load([FSDP / variant]))
        assert abs(document["replay_error_median"]) <= 0.05, variant
