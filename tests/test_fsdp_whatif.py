"""The FSDP what-if (issue #45, point 3) on the FSDP1/FSDP2 runs of `traces/torch/fsdp`:
the replay of the recorded setting against the steps the raw JSON measured, the calls
each setting changes against the calls the raw JSON holds, recommendations only above
the replay's error."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from conftest import REPO, run_cli
from test_schemas import validate

from planner.ingest import detect
from planner.prediction.fsdp_whatif import fsdp_whatif

FSDP = REPO / "traces" / "torch" / "fsdp"
VARIANTS = sorted(p.name for p in FSDP.iterdir() if p.is_dir())
GATHER = ("c10d::_allgather_base_", "c10d::allgather_")
SCATTER = "c10d::_reduce_scatter_base_"


def _raw(path) -> tuple[dict[int, int], Counter]:
    """Step -> its ProfilerStep's ns; (step, phase, kind) -> the c10d calls, the phase
    the ``forward``/``backward`` range of the step around the call."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    marked = [e for e in events if e["name"].startswith("ProfilerStep#")]
    steps = {int(e["name"].split("#")[1]): e for e in marked}
    phases = [e for e in events if e["name"] in ("forward", "backward")]
    calls: Counter = Counter()
    for e in events:
        if e["name"] not in (*GATHER, SCATTER):
            continue
        step = next((n for n, s in steps.items() if s["ts"] <= e["ts"] < s["ts"] + s["dur"]), None)
        phase = next(p["name"] for p in phases if p["ts"] <= e["ts"] < p["ts"] + p["dur"])
        kind = "reduce_scatter" if e["name"] == SCATTER else "all_gather"
        calls[step, phase, kind] += 1
    return {n: round(s["dur"] * 1000) for n, s in steps.items()}, calls


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    return {v: fsdp_whatif(detect.load([FSDP / v])) for v in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_recorded_setting_replays_within_5_percent_of_each_measured_step(
    variant: str, documents: dict[str, dict]
) -> None:
    """Each rank's measured steps are its ProfilerStep spans in the JSON; the replay of
    the recorded setting (each step's own collective times) is within 5% of each, and
    so is the job's replayed step of its measured one; the error that gates the
    recommendations (the typical times of the other steps) is reported beside it."""
    document = documents[variant]
    for rank in document["ranks"]:
        spans, _ = _raw(FSDP / variant / f"{rank['rank']}.json.gz")
        assert {s["iteration"] for s in rank["steps"]} == set(spans)
        for s in rank["steps"]:
            assert abs(s["measured"] * 1e9 - spans[s["iteration"]]) <= 1000
            assert abs(s["replayed"] / s["measured"] - 1) <= 0.05
            assert s["error"] == pytest.approx(s["typical"] / s["measured"] - 1)
    assert abs(document["replayed"] / document["measured"] - 1) <= 0.05
    assert document["rebuilt"] <= 0.05
    assert document["replay_error"] > 0


def _setting(document: dict, name: str, value) -> dict:
    return next(s for s in document["settings"] if (s["setting"], s["value"]) == (name, value))


def test_reshard_off_removes_exactly_the_backward_all_gathers(documents: dict[str, dict]) -> None:
    """From a run that reshards (FSDP2, FSDP1 FULL_SHARD), ``reshard_after_forward`` off
    drops its backward all-gathers per step, counted from the JSON, and adds nothing;
    from one that does not (FSDP2 without, FSDP1 SHARD_GRAD_OP), on adds one per unit
    (per reduce-scatter); the step gets faster without and slower with them."""
    for variant in ("fsdp2_reshard", "fsdp2_units2", "fsdp1_prefetch"):
        _, calls = _raw(FSDP / variant / "rank0.json.gz")
        backward = {calls[s, "backward", "all_gather"] for s, _, _ in calls}
        assert len(backward) == 1 and backward != {0}
        off = _setting(documents[variant], "reshard_after_forward", False)
        assert (off["removed"], off["added"]) == (backward.pop(), 0)
        assert off["predicted"] < documents[variant]["replayed"]
    for variant in ("fsdp2_noreshard", "fsdp1_grad_op"):
        _, calls = _raw(FSDP / variant / "rank0.json.gz")
        assert not any(calls[s, "backward", "all_gather"] for s, _, _ in calls)
        scatters = {calls[s, "backward", "reduce_scatter"] for s, _, _ in calls}
        on = _setting(documents[variant], "reshard_after_forward", True)
        assert (on["removed"], on["added"]) == (0, scatters.pop())
        assert on["predicted"] > documents[variant]["replayed"]


def test_prefetch_moves_releases_and_fewer_units_merge_calls(documents: dict[str, dict]) -> None:
    """Prefetching only moves all-gathers' releases (earlier with a depth, none later than
    traced: the runs' every collective was waited for where issued); one unit turns each
    (kind, phase) family of calls into one call."""
    document = documents["fsdp2_reshard"]
    _, calls = _raw(FSDP / "fsdp2_reshard" / "rank0.json.gz")
    step = next(s for s, _, _ in calls)
    gathers = calls[step, "forward", "all_gather"] + calls[step, "backward", "all_gather"]
    for depth in (1, 2):
        s = _setting(document, "prefetch", depth)
        assert (s["removed"], s["added"], s["later"]) == (0, 0, 0)
        assert 0 < s["earlier"] < gathers
    one = _setting(document, "units", 1)
    families = sum(1 for (s, _, _), n in calls.items() if s == step and n)
    in_step = sum(n for (s, _, _), n in calls.items() if s == step)
    assert (one["removed"], one["added"]) == (in_step, families)
    assert "finer units" in document["not_predicted"][0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_setting_is_recommended_only_beyond_the_replay_error(
    variant: str, documents: dict[str, dict]
) -> None:
    document = documents[variant]
    error = document["replay_error_worst"]
    errors = [r["error"] for p in document["ranks"] for r in p["steps"] if r["error"] is not None]
    assert error == max(abs(e) for e in errors) >= document["replay_error"]
    for s in document["settings"]:
        assert s["gain"] == pytest.approx(document["replayed"] / s["predicted"] - 1)
        assert s["recommended"] == (s["gain"] > error)
    best = max((s for s in document["settings"] if s["recommended"]), key=lambda s: s["gain"],
               default=None)  # fmt: skip
    if best is None:
        assert document["recommendation"] is None
    else:
        assert document["recommendation"]["gain"] == best["gain"] > error


def test_simulate_shows_the_fsdp_whatif(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --json`` holds the what-if (schema-valid), the same as the library's;
    the terminal view shows its table."""
    code, out, err = run_cli(["simulate", FSDP / "fsdp2_units2", "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    validate(document)
    expected = fsdp_whatif(detect.load([FSDP / "fsdp2_units2"]))
    got = {(s["setting"], s["value"]): s["predicted"] for s in document["fsdp_whatif"]["settings"]}
    assert got == pytest.approx({(s["setting"], s["value"]): s["predicted"]
                                 for s in expected["settings"]})  # fmt: skip
    code, out, err = run_cli(["simulate", FSDP / "fsdp2_units2"], capsys)
    assert code == 0 and "FSDP what-if" in out


def _beside_raw(path) -> tuple[float, float, int]:
    """From the JSON: the gloo records' time, the main thread's innermost CPU ops' time
    inside them (not the c10d calls), and the c10d calls inside a ``prefetch`` range of
    their thread, within the ProfilerSteps."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    inside = [e for e in events if any(a <= e["ts"] < b for a, b in steps)]
    main = next(e["tid"] for e in inside if e["name"].startswith("ProfilerStep#"))
    records = [e for e in inside if e["name"].startswith("gloo:")]
    ops = sorted((e for e in inside if e["tid"] == main and e.get("cat") == "cpu_op"),
                 key=lambda e: (e["ts"], -e["dur"]))  # fmt: skip
    leaves = [e for k, e in enumerate(ops) if not (k + 1 < len(ops)
              and ops[k + 1]["ts"] < e["ts"] + e["dur"])]  # fmt: skip
    leaves = [e for e in leaves if not e["name"].startswith("c10d::")]
    beside = sum(max(0.0, min(r["ts"] + r["dur"], e["ts"] + e["dur"]) - max(r["ts"], e["ts"]))
                 for r in records for e in leaves)  # fmt: skip
    ranges = [e for e in inside if "prefetch" in e["name"].lower()]
    ahead = sum(
        any(p["tid"] == c["tid"] and p["ts"] <= c["ts"] < p["ts"] + p["dur"] for p in ranges)
        for c in inside if c["name"] in (*GATHER, SCATTER)
    )  # fmt: skip
    return sum(r["dur"] for r in records), beside, ahead


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_run_overlapped_its_collectives_and_none_gains_by_prefetching(
    variant: str, documents: dict[str, dict]
) -> None:
    """On this host the ranks computed next to nothing while their collectives ran (the
    JSON: the main thread's innermost ops inside the gloo records, under 5% of them; the
    what-if counts from each c10d call, also under 5%). Where some calls were issued in
    a prefetch range (as many as the JSON holds), the what-if replays the collectives on
    the compute: no prefetch depth changes the step, and it says why; nowhere is a
    prefetch change recommended."""
    overlap = documents[variant]["overlap"]
    ahead = 0
    for rank in documents[variant]["ranks"]:
        time, beside, issued = _beside_raw(FSDP / variant / f"{rank['rank']}.json.gz")
        assert beside < 0.05 * time
        ahead += issued
    assert overlap["share"] < 0.05 and overlap["ahead"] == ahead
    assert overlap["serialised"] == (2 if ahead else 0)
    traced = documents[variant]["replayed"]
    for s in documents[variant]["settings"]:
        if s["setting"] == "prefetch":
            assert not s["recommended"]
            if ahead:
                assert s["predicted"] == pytest.approx(traced, rel=1e-6)
    note = overlap["note"]
    assert note.startswith("collectives never overlapped compute in this trace")
    assert ("issued ahead (prefetched)" in note) == bool(ahead)


def test_where_collectives_ran_beside_the_compute_prefetching_is_credited() -> None:
    """The same steps (``fsdp2_reshard``) as if each collective had had compute beside it
    all along: not serialised, and an all-gather released a unit ahead runs beside the
    compute (the step shorter); serialised, each one adds its time wherever released."""
    from planner.prediction.fsdp_steps import rank_programs
    from planner.prediction.fsdp_whatif import overlap_of, replay_program, with_prefetch

    job = detect.load([FSDP / "fsdp2_reshard"])
    programs = rank_programs(job, job.ranks[0])
    assert overlap_of(programs)["serialised"]
    hidden = {it: {**p, "collectives": [{**c, "beside": c["seconds"]} for c in p["collectives"]]}
              for it, p in programs.items()}  # fmt: skip
    assert not overlap_of(hidden)["serialised"] and overlap_of(hidden)["share"] == 1.0
    for program in programs.values():
        own = program["collectives"]
        early = with_prefetch(own, 1)
        assert replay_program(program, early) < replay_program(program, own) - 1e-4
        serial = program["compute"] + sum(c["seconds"] for c in own)
        for collectives in (own, early, with_prefetch(own, 2)):
            assert replay_program(program, collectives, True) == pytest.approx(serial, abs=1e-6)


def test_compute_in_flight_counts_from_the_call_and_a_prefetch_range_marks_it(
    tmp_path,
) -> None:
    """A collective in flight from its c10d call (in a ``prefetch`` range) to its gloo
    record's end: an op between the call and the record's start counts as compute beside
    it, which the exposed time (from the record's start) does not see."""
    from test_process_groups import _kineto

    op = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    annotation = {**op, "cat": "user_annotation"}
    events = [
        {**annotation, "name": "FSDP::backward_prefetch for 1", "ts": 100, "dur": 50},
        {**op, "name": "c10d::allreduce_", "ts": 110, "dur": 10,
         "args": {"Input Dims": [[[256]]], "Input type": ["TensorList"]}},
        {**op, "name": "aten::mm", "ts": 200, "dur": 100},  # 200..300
        {**annotation, "tid": 2, "name": "gloo:all_reduce", "ts": 250, "dur": 150,
         "args": {"Input Dims": [[256]], "Input type": ["float"]}},  # 250..400
    ]  # fmt: skip
    job = detect.load([_kineto(tmp_path / "rank0.json", events)])
    (rank,) = job.ranks
    meta = job.meta["ranks"][rank]
    ((exposed,),) = (s.values() for s in meta["exposed"].values())
    ((in_flight,),) = (s.values() for s in meta["in_flight"].values())
    assert exposed == 100_000  # 250..400 less mm's 250..300
    assert in_flight == [100_000, 1, 140_000]  # mm's 200..300 from the call at 110
