"""DDP bucket advice (`planner.planning.buckets`) on a real CPU DDP job recorded here at two caps,
against its own untraced step times (traces/torch/ddp_mlp24_gloo, see its README)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.ingest import netbench
from planner.ingest.kineto import load_kineto
from planner.job import stages
from planner.model.oracle import NetworkModel
from planner.planning import buckets

RUN = Path(__file__).resolve().parents[1] / "traces" / "torch" / "ddp_mlp24_gloo"
MEASURED = {
    cap: row["median_step_time"]
    for cap, row in json.loads((RUN / "measured.json").read_text()).items()
}
NETWORK = netbench.read_model(RUN / "net.csv")
RESNET = Path(__file__).resolve().parents[1] / "traces" / "torch" / "resnet_ddp"


def _job(cap: str):
    return load_kineto(sorted((RUN / f"cap{cap}").glob("rank*.json.gz")))


def _c10d_sizes(path: Path) -> tuple[list[list[int]], int]:
    """Per step, the element counts DDP queued (c10d::allreduce_, in queue order), and how
    many gloo records started out of that order, counted from the raw JSON."""
    with gzip.open(path) as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep")]
    out, swapped = [], 0
    for s in steps:
        inside = sorted(
            (e for e in events if s["ts"] <= e["ts"] < s["ts"] + s["dur"]), key=lambda e: e["ts"]
        )

        def numel(e):
            dims = e["args"]["Input Dims"]
            while isinstance(dims[0], list):
                dims = dims[0]
            return dims[0]

        queued = [numel(e) for e in inside if e["name"] == "c10d::allreduce_"]
        started = [numel(e) for e in inside if e["name"] == "gloo:all_reduce"]
        swapped += sum(a != b for a, b in zip(queued, started, strict=True))
        out.append(queued)
    return out, swapped


def test_gloo_records_started_out_of_order_keep_ddp_bucket_order():
    """At cap 0.001 every tensor is its own bucket; gloo's two threads start some
    all-reduces out of the order DDP queued them. The buckets keep DDP's order and sizes."""
    queued, swapped = _c10d_sizes(RUN / "cap0.001" / "rank0.json.gz")
    assert swapped > 0  # the trace really has records out of queue order
    assert all(q == queued[0] for q in queued) and queued[0] == [512, 262144] * 24
    p = buckets.profile(_job("0.001"))
    assert p.observed_buckets.tolist() == [4 * n for n in queued[0]]
    assert p.sizes.tolist() == p.observed_buckets.tolist()
    assert p.lanes == 2  # gloo ran two all-reduces at once


@pytest.mark.parametrize(
    ("path", "rule"),
    [(RUN / "cap4", "cap"), (RUN / "cap0.001", "cap"), (RESNET, "unset")],
    ids=["cap4", "cap0.001", "resnet_unset"],
)
def test_first_bucket_rule_is_read_from_the_trace(path, rule):
    """PyTorch 2.13 gives an explicit cap to the first bucket too (6 buckets of 4,202,496 B
    at cap 4); the resnet job ran with the cap unset (1 MiB first bucket, then 25 MiB)."""
    job = load_kineto(sorted(path.glob("rank*.json.gz")))
    p = buckets.profile(job)
    observed = buckets._observed_assignment(p)
    assert buckets.first_bucket_rule(p.sizes.tolist(), observed) == rule
    if path.name == "cap4":
        assert p.observed_buckets.tolist() == [4202496] * 6


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8 << 20), min_size=2, max_size=40),
    cap=st.integers(1 << 16, 64 << 20),
)
def test_first_bucket_rule_names_the_rule_that_built_the_buckets(sizes, cap):
    as_cap = buckets.first_bucket_rule(sizes, buckets.ddp_buckets(sizes, cap, cap))
    assert as_cap in {"cap", "either"}
    fixed = buckets.first_bucket_rule(sizes, buckets.ddp_buckets(sizes, cap))
    assert fixed in {"1 MiB", "unset", "either", "cap"}
    if fixed == "cap":  # only when a first bucket of `cap` builds the same buckets
        assert buckets.ddp_buckets(sizes, cap) == buckets.ddp_buckets(sizes, cap, cap)


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0, 0.1), st.integers(1, 1 << 24)), min_size=1, max_size=30),
    a=st.floats(0, 1e-3),
    b=st.floats(0, 1e-8),
)
def test_replay_without_contention_is_one_channel_in_order(data, a, b):
    """kappa 1 and one lane: bucket k starts at max(its last gradient, bucket k-1's end)."""
    work = np.sort(np.array([w for w, _ in data]))
    sizes = np.array([float(n) for _, n in data])
    ids = np.array(buckets.ddp_buckets(sizes.tolist(), 4 << 20))
    network = NetworkModel(a, b)
    free = 0.0
    for k in range(int(ids.max()) + 1):
        free = max(free, float(work[ids == k].max())) + network.time(float(sizes[ids == k].sum()))
    expected = max(free, float(work.max()))
    assert buckets.replay(work, ids, sizes, network, 1.0) == pytest.approx(expected, abs=1e-9)


def test_contention_is_calibrated_on_the_traced_steps():
    """gloo and the backward pass share the cores: without contention the traced cap-4
    buckets replay 5% fast against the network benchmark; kappa calibrated on the traced
    steps closes that, and no step is off by more than 6%."""
    sweep = stages.bucket_sweep(_job("4"), NETWORK)
    assert sweep["uncalibrated_replay_error"] < -0.03
    assert sweep["kappa"] > 1.2 and sweep["kappa_source"] == "calibrated on the traced steps"
    assert abs(sweep["replay_error"]) < 0.01 and sweep["replay_error_worst"] < 0.06


def test_bucket_advice_predicts_the_untraced_runs():
    """From the cap-4 trace alone, every cap's prediction is within 10% of the job's
    untraced median step at that cap, and the caps measured apart by more than 10%
    (0.001 > 1 > the rest) are predicted in that order."""
    sweep = buckets.sweep(_job("4"), NETWORK, caps_mb=(0.001, 1, 4, 100))
    predicted = {f"{c['bucket_cap_mb']:g}": c["predicted_step_time"] for c in sweep["caps"]}
    predicted["default"] = sweep["default_configuration"]["predicted_step_time"]
    assert sweep["default_configuration"]["buckets"] == 2  # 1 MiB first, then 25 MiB
    for cap, measured in MEASURED.items():
        assert predicted[cap] == pytest.approx(measured, rel=0.10), cap
    assert predicted["0.001"] > predicted["1"] > max(predicted[c] for c in ("4", "default", "100"))


def test_one_transfer_size_and_no_benchmark_says_why():
    """Every traced bucket has one size: no fit, so no predictions; the report says so."""
    sweep = stages.bucket_sweep(_job("4"))
    assert sweep["caps"] == [] and sweep["recommended_cap_mb"] is None
    assert "--network" in sweep["reason"]


def test_a_flat_network_fit_has_no_r2_and_the_sweep_is_valid_json():
    """A fit whose points all took the same time has no R² (`fit_network_model`: NaN);
    the sweep reports null, so that its report is valid JSON (the jittered copies of the
    transformer ranks in bench_ranks hit this)."""
    from planner.export.files import dumps

    flat = NetworkModel(a=NETWORK.a, b=0.0, r2=float("nan"))
    sweep = buckets.sweep(_job("4"), flat)
    assert sweep["network"]["r2"] is None
    assert json.loads(dumps(sweep))["caps"]


def _copy_rate_from_json(run: Path) -> float:
    """DDP's copy back into the gradients, counted from the raw JSON: per step and rank
    the summed ``copy_bucket_to_grad`` durations over the gradients' bytes, the median."""
    per_step = []
    for path in sorted(run.glob("rank*.json.gz")):
        with gzip.open(path) as handle:
            events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
        for s in (e for e in events if e["name"].startswith("ProfilerStep")):
            inside = [e for e in events if s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
            copies = [e["dur"] for e in inside if e["name"].endswith("copy_bucket_to_grad")]
            per_step.append(sum(copies) * 1e-6)
    return float(np.median(per_step)) / 25_214_976  # the 48 gradients' bytes (README)


def test_ddp_copies_the_buckets_back_after_the_backward_pass():
    """The copy rate is the trace's own (counted from the raw events); a lone bucket's
    copy follows its all-reduce, which follows the backward pass."""
    p = buckets.profile(_job("4"))
    assert p.copy_rate == pytest.approx(_copy_rate_from_json(RUN / "cap4"), rel=1e-6)
    assert 0.05e-9 < p.copy_rate < 1e-9  # memcpy speed: 1 to 20 GB/s
    work, sizes = np.array([0.010, 0.020]), np.array([4e6, 6e6])
    ids = np.array([0, 0])
    network = NetworkModel(1e-4, 1e-9)
    end = buckets.replay(work, ids, sizes, network, 1.0, 1, copy_rate=2e-10)
    assert end == pytest.approx(0.020 + 1e-4 + 1e-9 * 1e7 + 2e-10 * 1e7)


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0, 0.1), st.integers(1, 1 << 24)), min_size=1, max_size=30),
    rate=st.floats(0, 1e-9),
    kappa=st.floats(1, 4),
)
def test_the_copies_never_shorten_a_step(data, rate, kappa):
    """Copying takes time: with any copy rate a step ends no sooner than without, and no
    sooner than the backward pass plus every byte copied."""
    work = np.sort(np.array([w for w, _ in data]))
    sizes = np.array([float(n) for _, n in data])
    ids = np.array(buckets.ddp_buckets(sizes.tolist(), 1 << 20))
    network = NetworkModel(1e-4, 1e-9)
    plain = buckets.replay(work, ids, sizes, network, kappa, 2)
    copied = buckets.replay(work, ids, sizes, network, kappa, 2, copy_rate=rate)
    assert copied >= plain - 1e-12
    assert copied >= float(work.max()) + rate * float(sizes.sum()) - 1e-12


def test_the_profiler_cost_is_taken_out_with_the_untraced_step_time():
    """The traced cap-4 steps (87 ms) ran 6% slower than the same cap untraced (82.4 ms):
    told that, the sweep replays the traced buckets at the untraced time, and every cap
    stays within 6% of its untraced median (without it the traced cap itself is +6%)."""
    untraced = MEASURED["4"]
    told = buckets.sweep(
        _job("4"), NETWORK, caps_mb=(0.001, 1, 4, 100), untraced_step_time=untraced
    )
    plain = buckets.sweep(_job("4"), NETWORK, caps_mb=(0.001, 1, 4, 100))
    assert told["traced_step_time"] == pytest.approx(plain["measured_step_time"])
    assert told["profiler_cost"] == pytest.approx(told["traced_step_time"] / untraced - 1)
    assert 0.04 < told["profiler_cost"] < 0.08
    assert told["observed_predicted_step_time"] == pytest.approx(untraced, rel=0.01)
    for doc, bound in ((told, 0.06), (plain, 0.10)):
        predicted = {f"{c['bucket_cap_mb']:g}": c["predicted_step_time"] for c in doc["caps"]}
        predicted["default"] = doc["default_configuration"]["predicted_step_time"]
        for cap, measured in MEASURED.items():
            assert predicted[cap] == pytest.approx(measured, rel=bound), cap
    traced_cap = next(c for c in plain["caps"] if c["bucket_cap_mb"] == 4)
    assert traced_cap["predicted_step_time"] / MEASURED["4"] - 1 > 0.05


def test_an_untraced_step_time_far_from_the_trace_is_refused(capsys):
    """A step time that cannot be the traced configuration's (1 s against 87 ms) is bad
    input: one line naming the option, exit 2, nothing written."""
    from tests.conftest import run_cli

    code, out, err = run_cli(
        ["analyze", str(RUN / "cap4"), "--network", str(RUN / "net.csv"),
         "--untraced-step-time", "1.0", "--json"],
        capsys,
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "--untraced-step-time" in err and "2x" in err


@pytest.mark.parametrize("kappa", [1.0, 1.25, 2.0, 3.5])
def test_the_latest_ranks_work_is_the_largest_decontended_ready_time(kappa):
    """`backward_work` (all ranks at once, spans padded with empty ones) is, bit for bit,
    the largest over the ranks of `decontend` of each rank's traced ready times, and it
    is kept per kappa: the real 2-rank resnet DDP run, 15 buckets."""
    profile = buckets.profile(load_kineto(sorted(RESNET.glob("rank*.json.gz"))))
    assert profile is not None and any(s.busy for v in profile.steps.values() for s in v)
    works = buckets.backward_work(profile, kappa)
    for work, ranks in zip(works, profile.steps.values(), strict=True):
        one_by_one = np.max([buckets.decontend(s.ready, s.busy, kappa) for s in ranks], axis=0)
        assert np.array_equal(work, one_by_one)
        if kappa != 1.0:
            assert (work <= np.max([s.ready for s in ranks], axis=0)).all()
    assert buckets.backward_work(profile, kappa) is works


REFERENCE_RUN = RUN.parent / "ddp_mlp24_reference"
"""The example job traced at cap 1 (24 buckets) and at cap 100 (one bucket), interleaved
in one run of bench/bench_ddp_buckets.py, with every timed step (see its README)."""


@pytest.fixture(scope="module")
def reference_run():
    times = json.loads((REFERENCE_RUN / "times.json").read_text())
    measured = {key: float(np.median(v)) for key, v in times.items()}
    jobs = [load_kineto(sorted((REFERENCE_RUN / f"trace_{c}").glob("rank*.json.gz")))
            for c in (1, 100)]  # fmt: skip
    return jobs, measured, netbench.read_model(REFERENCE_RUN / "net.csv")


def test_the_backward_pass_factor_makes_the_traced_work_end_where_the_reference_ends(
    reference_run,
):
    """`backward_factor`: of the factors on the grid, the one whose backward work behind
    the 24-bucket trace's ready times ends nearest where the one-bucket trace's backward
    pass ends (medians over steps of the latest rank's last gradient, the profiler's cost
    taken out of both), with nothing of that backward pass overlapped."""
    (cap1, cap100), measured, _ = reference_run
    p = buckets.without_profiler(buckets.profile(cap1), measured["1.0"])
    ref = buckets.without_profiler(buckets.profile(cap100), measured["100.0"])
    assert len(ref.observed_buckets) == 1 and len(p.observed_buckets) == 24
    kappa_backward, source = buckets.backward_factor(p, ref)
    alone = np.median([max(s.ready.max() for s in v) for v in ref.steps.values()])

    def end(k: float) -> float:
        return float(np.median([w.max() for w in buckets.backward_work(p, k)]))

    assert 1.0 < kappa_backward < buckets.KAPPA_RANGE[1]
    gap = abs(end(kappa_backward) - alone)
    assert gap <= abs(end(kappa_backward - 0.05) - alone)
    assert gap <= abs(end(kappa_backward + 0.05) - alone)
    assert gap < 0.01 * alone
    assert source.startswith("measured") and "0% of its backward pass overlapped" in source
    assert "the end of the range" not in source
    # a reference whose backward pass ran longer than this trace's even uncontended (its
    # steps stretched to twice their time): the factor stops at 1 and says so
    slow = buckets.without_profiler(ref, ref.measured * 2)
    kappa_backward, source = buckets.backward_factor(p, slow)
    assert kappa_backward == 1.0
    assert "the end of the range 1-4: the two traces disagree by -" in source


def test_a_reference_must_be_the_same_job_traced_with_one_bucket(reference_run):
    """The 24-bucket trace as its own reference (collectives over most of its backward
    pass) and another job (resnet: other gradients) are refused, saying why."""
    (cap1, _), _, _ = reference_run
    p = buckets.profile(cap1)
    with pytest.raises(ValueError, match="overlap .* of the reference trace's backward pass"):
        buckets.backward_factor(p, p)
    resnet = buckets.profile(load_kineto(sorted(RESNET.glob("rank*.json.gz"))))
    with pytest.raises(ValueError, match="not the same job"):
        buckets.backward_factor(p, resnet)


def test_a_wrong_reference_is_one_line_naming_the_option(capsys):
    """Through the CLI a reference of another job is one line naming the option, exit 2;
    so is its untraced step time without it. A job without bucket advice (TF) says the
    reference went unused."""
    from tests.conftest import run_cli

    code, out, err = run_cli(
        ["analyze", str(REFERENCE_RUN / "trace_1"), "--reference-untraced-step-time", "0.08"],
        capsys,
    )
    assert code == 2 and out == "" and "needs --bucket-reference" in err
    code, out, err = run_cli(
        ["analyze", str(REFERENCE_RUN / "trace_1"), "--network", str(REFERENCE_RUN / "net.csv"),
         "--bucket-reference", str(REFERENCE_RUN / "trace_100"),
         "--reference-untraced-step-time", "1.0"],
        capsys,
    )  # fmt: skip
    assert code == 2 and out == "" and err.strip().count("\n") == 0
    assert "--bucket-reference: the reference's untraced step time: " in err and "2x" in err
    # no network model (its 24 transfers are of one size) and no benchmark: no advice
    code, out, err = run_cli(
        ["analyze", str(REFERENCE_RUN / "trace_1"), "--bucket-reference",
         str(REFERENCE_RUN / "trace_100")],
        capsys,
    )  # fmt: skip
    assert code == 0 and "no network model" in out
    assert "--bucket-reference: no DDP bucket advice for this job, not used" in err
    tf = Path(__file__).resolve().parents[1] / "traces" / "tf" / "mlp_ps_betweengraph_sync"
    code, out, err = run_cli(
        ["analyze", str(tf / "worker1"), "--bucket-reference", str(REFERENCE_RUN / "trace_100")],
        capsys,
    )  # fmt: skip
    assert code == 0 and "DDP bucket_cap_mb sweep" not in out
    assert "--bucket-reference: no DDP bucket advice for this job, not used" in err

    code, out, err = run_cli(
        ["analyze", str(REFERENCE_RUN / "trace_1"), "--network", str(REFERENCE_RUN / "net.csv"),
         "--bucket-reference", str(RESNET), "--json"],
        capsys,
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "--bucket-reference" in err and "same job" in err


@pytest.mark.parametrize("kappa", [1.0, 1.5, 2.35, 4.0])
def test_the_backward_factor_equal_to_kappa_is_the_one_kappa_model(reference_run, kappa):
    """Bit for bit: a backward factor equal to the collectives' is the symmetric model."""
    (cap1, _), _, network = reference_run
    p = buckets.profile(cap1)
    ids = buckets.ddp_buckets(p.sizes.tolist(), 4 * buckets.MIB, 4 * buckets.MIB)
    assert buckets.step_times(p, ids, network, kappa, kappa) == buckets.step_times(
        p, ids, network, kappa
    )


def test_the_reference_trace_separates_the_two_factors_and_predicts_every_cap(
    reference_run, capsys
):
    """On this run the reference measures the backward pass's factor at 2.35, and the
    collectives' `kappa` is then calibrated at 1.7 (1.5 before the profiler's cost was
    taken from the compute as far as the steps are wire-bound, here 0.17: the 24
    buckets' latencies; one `kappa` for both: 1.85, 1.7 before); every
    cap's prediction lies within 10% of its measured median (the bench's target), the
    recommendation (16 MB) within 5.3%. Through `planner analyze --bucket-reference` the
    report carries the same sweep."""
    from tests.conftest import run_cli

    (cap1, cap100), measured, network = reference_run
    sweep = stages.bucket_sweep(cap1, network, measured["1.0"], cap100, measured["100.0"])
    assert (sweep["kappa_backward"], sweep["kappa"]) == (2.35, 1.7)
    assert stages.bucket_sweep(cap1, network, measured["1.0"])["kappa"] == 1.85
    caps = [row["bucket_cap_mb"] for row in sweep["caps"]]
    predicted = [row["predicted_step_time"] for row in sweep["caps"]]
    errors = {c: t / measured[str(float(c))] - 1 for c, t in zip(caps, predicted, strict=True)}
    assert max(abs(e) for e in errors.values()) < 0.10
    assert sweep["recommended_cap_mb"] == 16 and abs(errors[16]) < 0.055
    code, out, _ = run_cli(
        ["analyze", str(REFERENCE_RUN / "trace_1"), "--network", str(REFERENCE_RUN / "net.csv"),
         "--untraced-step-time", repr(measured["1.0"]),
         "--bucket-reference", str(REFERENCE_RUN / "trace_100"),
         "--reference-untraced-step-time", repr(measured["100.0"]), "--json"],
        capsys,
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["bucket_sweep"] == json.loads(json.dumps(sweep))
    assert render_text(sweep).count("the backward pass's own 2.35 (measured") == 2


def render_text(sweep: dict) -> str:
    """What the terminal and the HTML report say of the sweep's contention."""
    from planner.reporting.plan_sections import buckets_section
    from planner_cli.render import sweep_model_line

    return sweep_model_line(sweep) + buckets_section({"bucket_sweep": sweep})
