"""One CLI: every command takes --json, schedulers refuse inputs they do not apply to, a
folder of runs is listed (or analysed with --each), globs expand, --rank where ranks can
be selected, and the metrics table names span and busy makespan as docs/algorithms.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest

from tests.conftest import DEMO, REPO, run_cli
from tests.test_schemas import validate

RESNET = REPO / "traces" / "torch" / "resnet_ddp"
TF_RUNS = REPO / "traces" / "tf"
WORKER1 = TF_RUNS / "mlp_ps_betweengraph_sync" / "worker1"
RANK_COMMANDS = {
    "inspect", "schedule", "metrics", "analyze", "convert", "simulate", "model", "export",
    "verify",
}  # fmt: skip


def _commands() -> dict[str, click.Command]:
    from planner_cli.main import cli

    return dict(cli.commands)


def _options(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) for o in p.opts}


def test_every_command_takes_json() -> None:
    missing = [name for name, c in _commands().items() if "--json" not in _options(c)]
    assert not missing, f"no --json: {missing}"


def test_rank_option_is_where_the_readme_says() -> None:
    with_rank = {name for name, c in _commands().items() if "--rank" in _options(c)}
    assert with_rank == RANK_COMMANDS
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if "`--rank`" in line)
    named = set(re.findall(r"`([a-z-]+)`", line)) & set(_commands())
    assert named == RANK_COMMANDS, line


def test_convert_json_prints_the_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, err = run_cli(["convert", DEMO, "--json"], capsys)
    assert status == 0, err
    document = json.loads(out)
    validate(document)
    assert document["schema"] == "planner.trace/1" and document["ranks"][0]["ops"]
    status, out, _ = run_cli(["convert", DEMO, "-o", tmp_path / "t.json", "--json"], capsys)
    assert status == 0 and json.loads(out) == json.loads((tmp_path / "t.json").read_text())


@pytest.mark.parametrize(
    ("path", "algorithm", "applies"),
    [(RESNET, "tac", "Caramel"), (RESNET, "tic", "Caramel"), (DEMO, "caramel", "TIC or TAC")],
)
def test_scheduler_that_does_not_apply_is_exit_2(
    path: Path, algorithm: str, applies: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(["schedule", path, "-a", algorithm], capsys)
    assert status == 2 and not out
    assert err.count("\n") == 1 and f"use {applies}" in err, err


def test_simulate_plan_that_does_not_apply_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["simulate", RESNET, "--plan", "tac", "--samples", "2"], capsys)
    assert status == 2 and "use Caramel" in err


def test_folder_of_runs_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["inspect", TF_RUNS], capsys)
    assert status == 2 and not out
    assert "mlp_ps_betweengraph_sync/worker0, mlp_ps_betweengraph_sync/worker1" in err
    assert "--each" in err


def test_each_analyses_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["inspect", TF_RUNS, "--each", "--json"], capsys)
    assert status == 0, err
    document = json.loads(out)
    validate(document)
    paths = [str(Path(r["path"]).relative_to(TF_RUNS)) for r in document["runs"]]

    # each worker of the between-graph jobs, each run of the in-graph jobs (traces/tf/README.md)
    def between(job: str) -> list[str]:
        return [f"{job}/run{k}/worker{w}" for k in (1, 2, 3) for w in (0, 1)]

    def within(job: str) -> list[str]:
        return [f"{job}/run{k}" for k in (1, 2, 3)]

    def pinned(job: str) -> list[str]:  # 1 ps + 1 worker, each on its own core
        return [f"{job}/run{k}" for k in (1, 2)]

    generated = ["mlp_ps_betweengraph_sync/worker0", "mlp_ps_betweengraph_sync/worker1"]
    assert paths == [
        "cnn_enforced/arrival",
        "cnn_enforced/none",
        "cnn_enforced_tac/arrival",  # the TAC plan enforced (traces/tf/README.md)
        "cnn_enforced_tac/sender",
        *between("cnn_ps_betweengraph"),
        *within("cnn_ps_ingraph"),
        *pinned("cnn_ps_pinned"),
        "lab_cnn_600mbit_reversed/run",  # a lab order check: TAC reversed, by arrival
        "lab_mlp_1500mbit",  # the lab's mlp trace phase (docs/validation.md)
        *between("mlp_ps_betweengraph"),
        *generated,
        *within("mlp_ps_ingraph"),
        *pinned("mlp_ps_pinned"),
        "mwms_cpu2",  # a TF2 multi-worker profile: one run of two workers' files
    ]
    assert {r["result"]["schema"] for r in document["runs"]} == {"planner.inspect/1"}
    worker1 = document["runs"][paths.index(generated[1])]["result"]["ranks"][0]["transfers"]
    assert [t["kind"] for t in worker1].count("recv") == 14


def test_each_with_a_gate_exits_1_when_any_run_fails(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a").symlink_to(DEMO)
    (runs / "b").symlink_to(WORKER1)
    status, out, _ = run_cli(["metrics", runs, "--each", "--min-efficiency", "0.99"], capsys)
    assert status == 1 and "run " in out
    status, _, err = run_cli(["metrics", runs, "--each", "--junit", tmp_path / "j.xml"], capsys)
    assert status == 2 and "--junit" in err and not (tmp_path / "j.xml").exists()


def test_quoted_globs_expand(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["inspect", str(TF_RUNS / "*" / "worker1"), "--json"], capsys)
    assert status == 0, err
    assert json.loads(out)["ranks"][0]["rank"] == "worker1"
    status, _, err = run_cli(["inspect", str(TF_RUNS / "nothing*")], capsys)
    assert status == 2 and "no file or directory matches" in err


def test_analyze_ranks_splits_a_run_folder(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["analyze-ranks", RESNET, "-j", "1", "--json"], capsys)
    assert status == 0, err
    document = json.loads(out)
    validate(document)
    assert document["job"]["ranks"] == 2


def test_model_and_verify_select_a_rank(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["model", RESNET, "--rank", "rank1", "--json"], capsys)
    assert status == 0, err
    status, _, err = run_cli(["model", RESNET, "--rank", "rank7"], capsys)
    assert status == 2 and "rank0, rank1" in err


def test_metrics_shows_span_and_busy_makespan(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["metrics", DEMO, "--wide"], capsys)
    assert status == 0, err
    header = next(line for line in out.splitlines() if "Umax" in line)
    assert all(f" {name} " in header for name in ("span", "idle", "busy", "Lmin", "E", "S"))
    document = json.loads(run_cli(["metrics", DEMO, "--json"], capsys)[1])
    for step in document["steps"]:
        # busy makespan m <= Umax (E in [0, 1]); the span adds the idle time back
        assert step["lmin"] <= step["busy_makespan"] <= step["umax"] + 1e-12
        assert step["makespan"] == pytest.approx(step["busy_makespan"] + step["idle"])


def test_metrics_shows_the_executor_queue_of_tf_steps_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run_cli(["metrics", DEMO, "--wide"], capsys)
    assert status == 0, err
    header = next(line for line in out.splitlines() if "Umax" in line)
    assert "queued" in header and "waited in TensorFlow's executor" in " ".join(out.split())
    document = json.loads(run_cli(["metrics", DEMO, "--json"], capsys)[1])
    validate(document)
    assert all(0 < step["queued"] <= step["makespan"] for step in document["steps"])
    status, out, err = run_cli(["metrics", RESNET, "--wide"], capsys)
    assert status == 0, err
    assert "queued" not in next(line for line in out.splitlines() if "Umax" in line)
    document = json.loads(run_cli(["metrics", RESNET, "--json"], capsys)[1])
    assert not any("queued" in step for step in document["steps"])


def test_every_option_says_what_it_does() -> None:
    """Issue #46: help for every option of every command (`--help` is the manual an
    installed package carries)."""
    bare = [
        f"{name} {param.opts[0]}"
        for name, command in _commands().items()
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not param.help
    ]
    assert bare == []


def test_a_plans_m_plus_is_in_ms_where_it_is_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    """TAC's M+ is a time (TicTac Eq. 6, seconds in the document): shown in ms under a
    header that says so, ∞ where a transfer completes no op; TIC's M+ counts ops (each
    op takes 1) and is not shown as a time."""
    code, out, _ = run_cli(["schedule", "-a", "tac", DEMO, "--json"], capsys)
    entry = json.loads(out)["ranks"][0]
    first = entry["transfers"][0]["M_plus"]
    code, out, _ = run_cli(["schedule", "-a", "tac", DEMO], capsys)
    assert code == 0 and "M+ (ms)" in out and f"{first * 1e3:,.3f}" in out
    assert "∞" in out and " inf " not in out  # the sync token and global step
    code, out, _ = run_cli(["schedule", "-a", "tic", DEMO], capsys)
    assert code == 0 and "M+" not in out


def test_the_demo_says_nothing_of_its_own_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled demo's meta.json (what was run) is no trace to skip with a note."""
    code, out, err = run_cli(["inspect", DEMO], capsys)
    assert code == 0 and "meta.json" not in out + err


def test_analyze_ranks_prints_rounded_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """`analyze-ranks` said `efficiency mean 0.3671425977296101`: the figures are rounded
    as every other table rounds them (E to 3 decimals, times in s or ms), the JSON keeps
    them whole."""
    code, out, _ = run_cli(["analyze-ranks", RESNET], capsys)
    assert code == 0
    code, raw, _ = run_cli(["analyze-ranks", RESNET, "--json"], capsys)
    job = json.loads(raw)["job"]
    assert f"efficiency E mean {job['mean_efficiency']:.3f}," in out
    assert not re.search(r"\d\.\d{5,}", out), out  # no float printed whole


def test_tf_only_text_stays_on_tf_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    """The replayed column's note on `planner export --enforce` (a TF GraphDef rewrite)
    is printed under a TF job's comparison, not under a PyTorch job's."""
    code, torch_out, _ = run_cli(["simulate", RESNET, "--samples", "3", "--detail"], capsys)
    torch_out = " ".join(torch_out.split())  # the caption's lines as one
    assert code == 0 and "replayed:" in torch_out and "export --enforce" not in torch_out
    code, tf_out, _ = run_cli(["simulate", DEMO, "--samples", "3", "--detail"], capsys)
    assert code == 0 and "export --enforce" in " ".join(tf_out.split())


def test_global_options_go_after_the_command_too(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #46: `planner inspect X --no-color` was "No such option"; the group's options
    are taken wherever they stand, and the output is the one they give before the
    command."""
    from planner_cli.main import hoist_globals

    _, before, _ = run_cli(["--no-color", "inspect", DEMO], capsys)
    code, after, err = run_cli(["inspect", DEMO, "--no-color"], capsys)
    assert code == 0 and after == before, err
    given = ["metrics", "x", "--step-marker", "S", "--no-color", "--", "--no-color"]
    assert hoist_globals(given) == [
        "--step-marker", "S", "--no-color", "metrics", "x", "--", "--no-color",
    ]  # fmt: skip
    assert hoist_globals(["inspect", "--comm-patterns=p.json", "x"])[0] == "--comm-patterns=p.json"


def test_analyze_of_one_rank_selected_from_a_ddp_job(capsys: pytest.CaptureFixture[str]) -> None:
    """`analyze RUN --rank rank1` on a DDP run ended in KeyError 'rank0': the bucket
    profile walked every rank the load had seen, not the ranks the job holds."""
    code, out, err = run_cli(["analyze", RESNET, "--rank", "rank1", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert [r["rank"] for r in report["metrics"]["ranks"]] == ["rank1"]
    assert report["bucket_sweep"] is not None


def test_the_arrival_caution_cites_the_job_it_was_measured_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo (the mlp job) said "on the cnn job the replay missed the enforced step by
    7.5%" as if of itself: the figure is cited as the generated cnn job's, with where to
    read it, and is the one the library holds."""
    from planner.prediction.enforced import UNCERTAINTY, caution

    code, _, err = run_cli(["simulate", DEMO, "--samples", "3"], capsys)
    assert code == 0
    said = " ".join(err.split())
    assert "on the cnn job" not in said
    cited = (
        "measured against runs that enforced a plan (the generated TF cnn job: planner docs "
        f"algorithms), the replay missed the enforced step by {UNCERTAINTY['arrival']:.1%}"
    )
    assert cited in said and cited in caution("arrival")
    figure = f"{UNCERTAINTY['arrival']:.1%}"
    assert figure in (REPO / "docs" / "commands" / "simulate.md").read_text(encoding="utf-8")


def _header(out: str, title: str) -> str:
    """The header lines (names and units) of the table titled `title`, joined."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    top = next(i for i in range(start, len(lines)) if lines[i].startswith("┏"))
    end = next(i for i in range(top, len(lines)) if lines[i].startswith("┡"))
    return "\n".join(lines[top + 1 : end])


def test_time_columns_name_their_unit(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #46 point 5: the unit of a table's times is under its headers, not in its
    title (the model's iteration times, a sweep's predicted times, the network fit's
    residuals), and a throughput is a plain number (``1.129e+04`` before)."""
    code, out, _ = run_cli(["model", DEMO], capsys, columns=120)
    assert code == 0 and "Iteration time vs workers (§III)," not in out
    header = _header(out, "Iteration time vs workers")
    assert header.count("(ms)") == 3 and all(a in header for a in ("1ps", "p2p", "ring"))
    assert not re.search(r"\de\+\d", out), "a throughput in e-notation"
    code, out, _ = run_cli(
        ["simulate", DEMO, "--samples", "3", "--sweep", "bandwidth-scale=0.5:2:2"],
        capsys,
        columns=120,
    )
    assert code == 0 and "predicted time in" not in out
    assert _header(out, "Sweep of bandwidth_scale").count("(ms)") == 4
    code, out, _ = run_cli(
        ["fit-network", REPO / "traces" / "net" / "gloo_2ranks_loopback.csv"], capsys
    )
    assert code == 0 and "Residuals (µs)" not in out
    assert _header(out, "Residuals").count("(µs)") == 3


def test_the_ci_summary_counts_its_steps_in_agreement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`metrics --markdown` said "1 steps checked": the count agrees with its noun, on
    the demo's steps and on its first step alone."""
    from planner.reporting import ci

    summary = tmp_path / "summary.md"
    code, _, err = run_cli(["metrics", DEMO, "--markdown", summary], capsys)
    assert code == 0, err
    document = json.loads(run_cli(["metrics", DEMO, "--json"], capsys)[1])
    steps = len(document["steps"])
    assert steps > 1
    assert f"\n{steps} steps checked (tensorflow), 0 failing." in summary.read_text()
    one = {**document, "steps": document["steps"][:1]}
    text = ci.markdown_summary(one, ci.Thresholds())
    assert "\n1 step checked (tensorflow), 0 failing." in text
