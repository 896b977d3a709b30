"""planner's predictions of DDP configurations it did not trace, judged against measured
runs of those configurations: the lab's grid of 2 models x 4 rates (issue #44; stored
in bench/lab/results/ddp-grid, its tables in docs/validation.md) and 2 x 2 rates
recorded after the model was last changed on the grid (ddp-heldout), re-predicted by
this checkout (`bench.lab.repredict`, the untraced step time of the traced
configuration as the interleaved measurement timed it).

The floors are what the model reached when the grid was recorded: a change that makes
a prediction miss where it passed fails here; one that passes more raises a floor."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

import pytest

from bench.lab import repredict
from tests.conftest import REPO

RESULTS = REPO / "bench" / "lab" / "results"
# (job, rate) -> predictions within 5% of the measured median or inside the 95%
# interval of the measured ratio to plain, of those printed
FLOORS = {
    ("ddp-grid", "ddp-mlp", "unshaped"): (6, 7),  # cap0.25 +23%: 24 buckets on a loopback
    ("ddp-grid", "ddp-mlp", "3000mbit"): (5, 7),  # the small caps' overlap, under-predicted
    ("ddp-grid", "ddp-mlp", "800mbit"): (7, 7),
    ("ddp-grid", "ddp-mlp", "130mbit"): (5, 7),  # caps 2 and 8 +5.3-5.8%
    ("ddp-grid", "ddp-wide", "unshaped"): (3, 4),  # cap16 +15%
    ("ddp-grid", "ddp-wide", "6000mbit"): (5, 5),
    ("ddp-grid", "ddp-wide", "1700mbit"): (4, 4),
    ("ddp-grid", "ddp-wide", "270mbit"): (4, 4),
    ("ddp-heldout", "ddp-mlp", "1500mbit"): (7, 7),
    ("ddp-heldout", "ddp-mlp", "400mbit"): (5, 7),
    ("ddp-heldout", "ddp-wide", "3000mbit"): (4, 4),
    ("ddp-heldout", "ddp-wide", "600mbit"): (4, 4),
}
SETS = sorted({key[0] for key in FLOORS})


def _repredicted(
    folders: Iterable[tuple[tuple[str, ...], Path]], with_job: bool = True, benchmark: bool = True
) -> dict[tuple[str, ...], dict]:
    """Each run of each lab folder re-predicted by this checkout (`repredict`, anchored
    on the measured plain median), keyed by the folder's key, the run's job where
    `with_job`, and its rate."""
    found = {}
    for key, folder in sorted(set(folders)):
        for record in repredict.repredict(folder, "measured", benchmark=benchmark):
            found[(*key, *([record["job"]] if with_job else []), record["rate"])] = record
    return found


@pytest.fixture(scope="module")
def records() -> dict[tuple[str, str, str], dict]:
    return _repredicted(((n,), RESULTS / n / j) for n in SETS for j in ("mlp", "wide"))


def test_every_run_of_the_grid_is_judged(records: dict) -> None:
    assert set(records) == set(FLOORS)


@pytest.mark.parametrize("run", sorted(FLOORS))
def test_no_prediction_misses_where_it_passed(records: dict, run: tuple[str, str, str]) -> None:
    judged = records[run]["judged"]
    floor, printed = FLOORS[run]
    assert len(judged) == printed
    assert sum(r["passes"] for r in judged) >= floor, repredict.verdict_line(records[run])


# the DDP runs recorded after the grid and the held-out runs: with the hook's cost
# measured (DDP's own buckets at the smallest cap through the gated hook; ddp-hook),
# and then with the Caramel plan measured too, written or not (ddp-caramel)
HOOK_FLOORS = {
    ("ddp-hook/mlp-unshaped-800mbit", "ddp-mlp", "unshaped"): (4, 8),  # cap0.25 -22%
    ("ddp-hook/mlp-unshaped-800mbit", "ddp-mlp", "800mbit"): (8, 8),
    ("ddp-hook/mlp-wide-3000mbit", "ddp-mlp", "3000mbit"): (3, 8),  # the small caps' gain
    ("ddp-hook/mlp-wide-3000mbit", "ddp-wide", "3000mbit"): (5, 5),
    ("ddp-hook/wide-unshaped-1700mbit", "ddp-wide", "unshaped"): (6, 7),  # caramel +6.5%
    ("ddp-hook/wide-unshaped-1700mbit", "ddp-wide", "1700mbit"): (6, 6),
    ("ddp-caramel/mlp", "ddp-mlp", "unshaped"): (3, 10),  # the loopback's caps, +26-88%
    ("ddp-caramel/mlp", "ddp-mlp", "3000mbit"): (6, 9),
    ("ddp-caramel/mlp", "ddp-mlp", "800mbit"): (8, 9),
    # the caps +14-18% (kappa), which the hook's pass over 4 MiB buckets, priced at
    # the trace's copy rate, takes to +21.7% (3 of 6 without the pass)
    ("ddp-caramel/wide", "ddp-wide", "unshaped"): (2, 6),
    ("ddp-caramel/wide", "ddp-wide", "1700mbit"): (5, 6),
}


@pytest.fixture(scope="module")
def hook_records() -> dict[tuple[str, str, str], dict]:
    return _repredicted(((name,), RESULTS / name) for name, _, _ in HOOK_FLOORS)


@pytest.mark.parametrize("run", sorted(HOOK_FLOORS))
def test_no_prediction_of_the_hook_runs_misses_where_it_passed(
    hook_records: dict, run: tuple[str, str, str]
) -> None:
    judged = hook_records[run]["judged"]
    floor, printed = HOOK_FLOORS[run]
    assert len(judged) == printed
    assert sum(r["passes"] for r in judged) >= floor, repredict.verdict_line(hook_records[run])


def test_the_hook_runs_medians_are_the_raw_steps(hook_records: dict) -> None:
    for name in sorted({key[0] for key in HOOK_FLOORS}):
        for run in json.loads((RESULTS / name / "lab.json").read_text())["runs"]:
            _same_medians(run, hook_records[(name, run["job"], run["rate"])]["summary"]["rows"])


def _per_call_interval(record: dict) -> tuple[float, float]:
    """The 95% interval of the hook's measured cost per call (s): its ratio's to the same
    buckets without it, in seconds of that configuration's median step, over the calls."""
    hook = record["summary"]["hook"]
    step = record["summary"]["rows"][hook["against"]]["median_s"]
    return tuple((hook[k] - 1.0) * step / hook["calls"] for k in ("ratio_low", "ratio_high"))


def test_the_hooks_cost_is_predicted_where_it_is_spent(hook_records: dict) -> None:
    """Issue #44 point 3: the hook's cost measured in the lab and counted in the
    prediction of a hooked plan. DDP's own buckets at the smallest cap through the gated
    hook, against the same cap without it. On the mlp's CPU-bound loopback the calls cost
    the step 0.24 ms each (predicted 0.24: they delay the backward pass); where the link
    is the bottleneck (800 Mbit/s) 0.03 ms (predicted 0.01: the wire hides them). On the
    wide model's 4 MiB buckets a call cost 0.90 and 0.54 ms unshaped: the hook's pass
    over the bucket's bytes, priced at the trace's copy rate (predicted 1.42 and 0.81).
    Over the 11 runs the predicted cost of a call lies inside its measured interval in
    8; the hooked row's error is its cap's, give or take 5 points, in 10."""
    hooks = {run: r["summary"]["hook"] for run, r in hook_records.items()}
    assert len(hooks) == 11 and all(h is not None and h["calls"] >= 4 for h in hooks.values())
    cpu = hooks[("ddp-hook/mlp-unshaped-800mbit", "ddp-mlp", "unshaped")]
    wire = hooks[("ddp-hook/mlp-unshaped-800mbit", "ddp-mlp", "800mbit")]
    assert cpu["ratio_low"] > 1.0  # measurably slower
    assert cpu["predicted_call_s"] == pytest.approx(cpu["call_s"], rel=0.25)
    assert wire["call_s"] < 0.05e-3 and wire["predicted_call_s"] < 0.05e-3
    wide = [h for (_, job, rate), h in hooks.items() if job == "ddp-wide" and rate == "unshaped"]
    assert len(wide) == 2 and all(h["call_s"] > 2 * cpu["call_s"] for h in wide)
    assert all(h["predicted_call_s"] > 2 * cpu["predicted_call_s"] for h in wide)
    inside = [
        low <= hooks[run]["predicted_call_s"] <= high
        for run, (low, high) in ((run, _per_call_interval(r)) for run, r in hook_records.items())
    ]
    assert sum(inside) >= 8
    errors = {run: r["summary"]["rows"] for run, r in hook_records.items()}
    close = [
        abs(rows["hook"]["error"] - rows[hooks[run]["against"]]["error"]) <= 0.05
        for run, rows in errors.items()
    ]
    assert sum(close) >= 10


def test_no_caramel_plan_that_measured_slower_was_written_or_predicted_faster(
    hook_records: dict,
) -> None:
    """Done-when: no written plan slower than plain. The lab now measures the Caramel plan
    analyze predicts whether or not it writes it (ddp-caramel, and the wide model's
    recording in ddp-hook): it wrote none of the 7. The three that measured slower than
    plain (the mlp at 800 Mbit/s, +10.5%; the wide model at 1700 Mbit/s, +6.9% and
    +8.5%) were predicted slower (+14.6%, +2.1%, +2.7%: the hook's calls, its passes over
    the 16 MiB of gradients and the plan's depths). Of the 6 the hook applied, 5 are
    predicted within 5% or inside the measured interval (the wide model unshaped, +3.8%
    for -0.5% [-4.5%, +3.1%], is not); the seventh is DDP's own order, which DDP
    applied."""
    caramel = {run: r for run, r in hook_records.items() if "caramel" in r["summary"]["rows"]}
    assert len(caramel) == 7
    slower = 0
    for run, record in caramel.items():
        assert record["caramel_written"] is False, run
        rows = record["summary"]["rows"]
        row = rows["caramel"]
        if row["ratio_low"] > 1.0:
            slower += 1
            assert row["predicted_s"] > rows["plain"]["predicted_s"], run
    assert slower == 3
    applied = {run: r["repeats"][0]["applied_by"]["caramel"] for run, r in caramel.items()}
    assert sorted(applied.values()) == ["ddp"] + ["hook"] * 6
    passes = [
        next(j for j in r["judged"] if j["config"] == "caramel")["passes"]
        for run, r in caramel.items()
        if applied[run] == "hook"
    ]
    assert sum(passes) >= 5


def test_every_recommended_cap_was_measured_and_is_fastest_or_within_its_interval(
    records: dict, hook_records: dict
) -> None:
    """Done-when: the recommended cap is the fastest measured, or inside the interval of
    it. The lab measures one cap per bucket layout, so a recommended cap may run as
    another of its layout: wide unshaped's cap4 is cap0.25's 4 buckets (-6.5% against
    plain where the fastest, cap8, was -8.1%); recorded again, its cap4 was the fastest
    (-6.9%). 9 of 11 within; the misses are both mlp runs recorded later: at 3000
    Mbit/s, cap2 -13.6% where cap0.5 was -16.4%; at 800 Mbit/s, cap0.25 -2.8% where
    cap0.5 was -4.1%."""
    every = {**records, **hook_records}
    recommended = {run: r["summary"] for run, r in every.items() if r["summary"]["recommended"]}
    assert len(recommended) == 11
    missed = set()
    for run, summary in recommended.items():
        assert summary["recommended_measured_as"] is not None, run
        if not summary["recommended_within_interval_of_fastest"]:
            missed.add(run)
    assert missed <= {
        ("ddp-hook/mlp-wide-3000mbit", "ddp-mlp", "3000mbit"),
        ("ddp-caramel/mlp", "ddp-mlp", "800mbit"),
    }
    wide = records[("ddp-grid", "ddp-wide", "unshaped")]["summary"]
    assert (wide["recommended"], wide["recommended_measured_as"]) == ("cap4", "cap0.25")


def test_the_measured_medians_are_the_raw_steps(records: dict) -> None:
    """Recounted from lab.json's per-step times: each configuration's median over both
    repeats, and the plain median the predictions were anchored on."""
    for name in SETS:
        for job in ("mlp", "wide"):
            for run in json.loads((RESULTS / name / job / "lab.json").read_text())["runs"]:
                _same_medians(run, records[(name, run["job"], run["rate"])]["summary"]["rows"])


def _same_medians(run: dict, rows: dict, timed: int = 2 * 20) -> None:
    """Each row's median is the median of its raw step times, `timed` of them (the lab's
    --steps x --repeats: 20 x 2 unless said)."""
    for label, row in rows.items():
        steps = [t for rep in run["repeats"] for t in rep["times"][label]]
        assert len(steps) == timed
        assert row["median_s"] == statistics.median(steps)


@pytest.mark.parametrize(
    "run",
    [("ddp-grid", "1700mbit"), ("ddp-grid", "270mbit"), ("ddp-heldout", "3000mbit"),
     ("ddp-heldout", "600mbit")],
)  # fmt: skip
def test_the_ranking_holds_where_the_link_is_the_bottleneck(
    records: dict, run: tuple[str, str]
) -> None:
    """The wide model on a shaped link: the caps are predicted in their measured order,
    and the fastest cap is the one predicted fastest."""
    summary = records[(run[0], "ddp-wide", run[1])]["summary"]
    assert summary["spearman_caps"] == pytest.approx(1.0)
    caps = {k: r for k, r in summary["rows"].items() if k.startswith("cap")}
    assert min(caps, key=lambda c: caps[c]["predicted_s"]) == summary["fastest_cap"]


# Without the bench-network CSV, from the trace's own network fit: where every step's
# all-reduces are one block on the link (`caramel.link_bound_throughput`). Before that
# fit, 1, 2, 2 and 1 of these passed (6 of 22; 33 of 67 over the whole grid, 49 now).
TRACE_FIT_FLOORS = {
    ("ddp-grid", "mlp", "130mbit"): (7, 7),
    ("ddp-grid", "wide", "270mbit"): (4, 4),
    ("ddp-heldout", "mlp", "400mbit"): (6, 7),
    ("ddp-heldout", "wide", "600mbit"): (4, 4),
}


@pytest.fixture(scope="module")
def trace_fit_records() -> dict[tuple[str, str, str], dict]:
    folders = (((n, j), RESULTS / n / j) for n, j, _ in TRACE_FIT_FLOORS)
    return _repredicted(folders, with_job=False, benchmark=False)


@pytest.mark.parametrize("run", sorted(TRACE_FIT_FLOORS))
def test_the_trace_fit_predicts_the_slow_links_without_a_benchmark(
    trace_fit_records: dict, run: tuple[str, str, str]
) -> None:
    record = trace_fit_records[run]
    assert record["predicted"]["sweep"]["network_source"] == "trace"
    judged = record["judged"]
    floor, printed = TRACE_FIT_FLOORS[run]
    assert len(judged) == printed
    assert sum(r["passes"] for r in judged) >= floor


# The TF grid (bench/lab/results/tf-grid2, stored with its traces): each plan in each
# enforcement mode, replayed on the plain run's trace, against the measured medians of
# the exported plans, anchored on the measured plain median. Recorded after the reads'
# rate and the link shared by connection; the replay before them passed 4, 5, 3, 3 (mlp)
# and 4, 4, 4, 3 (cnn) of these: 30 of 40, now 36 (mlp's Spearman at 1500 and 600
# Mbit/s -0.95 and -0.79, now +0.63 and +0.79; the cnn's 600 and 100 Mbit/s from 3 to 4
# and 5 once each read's folded control message was chained with its data, not left at
# its traced 3-4 ms share of the link). The predicted step is now untraced / (1 + gain),
# the replay's gain exactly (it was untraced x (1 - gain), which hid about 5 points of
# the chains' cost: 33 of 40 exact), a control message is every rank's (per rank,
# worker1 of the cnn at 600 Mbit/s priced each hop at 0.79 ms): 35 of 40, and the link's
# rate is the median of its steps' (a step missing its peer's records read the mlp's
# 600 Mbit/s link at 545): 34 of 40, the mlp's arrival chains at 1500 and 600 Mbit/s from
# +3.2-4.6% to +0.0-1.0%, the cnn's fast links' TIC further below its measured step.
# The misses left are arrival chains (docs/validation.md).
TF_FLOORS = {
    ("mlp", "unshaped"): (4, 5),  # tic-arrival -5.5%
    ("mlp", "3000mbit"): (5, 5),
    ("mlp", "1500mbit"): (5, 5),
    ("mlp", "600mbit"): (5, 5),
    ("cnn", "unshaped"): (4, 5),  # tic-arrival -13.1% (TIC measured 3.6 ms slower than TAC)
    ("cnn", "1500mbit"): (4, 5),  # tic-arrival -7.7% (TIC measured 4.1 ms slower than TAC)
    ("cnn", "600mbit"): (4, 5),  # tic-arrival -5.6%
    ("cnn", "100mbit"): (3, 5),  # tac-arrival +5.9%, tic-arrival +5.7%
}


@pytest.fixture(scope="module")
def tf_records() -> dict[tuple[str, str], dict]:
    return _repredicted((((j,), RESULTS / "tf-grid2" / j) for j in ("mlp", "cnn")), False)


def _judged(records: dict, floors: dict, run: tuple[str, str]) -> list[dict]:
    """`run`'s judged predictions, after checking every run of `floors` was judged and
    `run` printed as many predictions as its floor says and passed at least that many."""
    assert set(records) == set(floors)
    judged = records[run]["judged"]
    floor, printed = floors[run]
    assert len(judged) == printed
    assert sum(r["passes"] for r in judged) >= floor, repredict.verdict_line(records[run])
    return judged


@pytest.mark.parametrize("run", sorted(TF_FLOORS))
def test_the_tf_replay_predicts_the_enforced_plans(tf_records: dict, run: tuple[str, str]) -> None:
    judged = _judged(tf_records, TF_FLOORS, run)
    _same_medians(tf_records[run], tf_records[run]["summary"]["rows"])
    # sender costs nothing and the replay says so: within 5% on every run
    assert all(abs(r["error"]) <= 0.05 for r in judged if r["config"].endswith("-sender"))


# TF runs recorded after the last change to the TF replay (the control message of every
# rank, the link's rate per step), never used to set it: 28 of 30. The misses are the
# cnn's arrival chains at 1500 Mbit/s, predicted +16% against plain and measured +32-33%:
# on the fast links each hop also waits for the worker to send its marker and the PS to
# dispatch the read (0.45-0.6 ms a hop in the enforced runs' traces, 0.15 replayed).
TF_HELDOUT_FLOORS = {
    ("cnn", "unshaped"): (5, 5),
    ("cnn", "1500mbit"): (3, 5),  # tac-arrival -12.5%, tic-arrival -11.7%
    ("cnn", "600mbit"): (5, 5),
    ("cnn-100mbit", "100mbit"): (5, 5),
    ("mlp", "3000mbit"): (5, 5),
    ("mlp", "1500mbit"): (5, 5),
}


@pytest.fixture(scope="module")
def tf_heldout() -> dict[tuple[str, str], dict]:
    folders = (((name,), RESULTS / "tf-heldout" / name) for name, _ in TF_HELDOUT_FLOORS)
    return _repredicted(folders, with_job=False)


@pytest.mark.parametrize("run", sorted(TF_HELDOUT_FLOORS))
def test_the_tf_replay_predicts_runs_it_was_not_set_on(tf_heldout: dict, run: tuple) -> None:
    judged = _judged(tf_heldout, TF_HELDOUT_FLOORS, run)
    # --steps 10, two repeats (the cnn at 100 Mbit/s: one)
    timed = 10 if run[0] == "cnn-100mbit" else 20
    _same_medians(tf_heldout[run], tf_heldout[run]["summary"]["rows"], timed)
    # sender costs nothing and the replay says so (the unshaped cnn's TIC: -5.6%, inside
    # its interval, +7.2% [-5.9%, +14.3%])
    assert all(r["passes"] for r in judged if r["config"].endswith("-sender"))
