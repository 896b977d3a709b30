"""Text output that fits a terminal (issue #46 point 4): every command's tables at 80
columns, on the bundled TF demo and a 2-rank DDP run, with no line longer and no cell cut
(rich marks a cut with ``…``), and its notes and warnings on stderr wrapped likewise;
``COLUMNS`` is honoured when piped; `--detail` prints the tables the default leaves out,
`--wide` the columns, and each command's page says so where its output leaves any out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEMO, REPO, RESNET_IN_REPO, run_cli

NET_CSV = REPO / "traces" / "net" / "gloo_2ranks_loopback.csv"
UNIT_IN_CELL = re.compile(r"\d (ms|µs|s|ns) *│")
"""A time whose unit sits in its cell: a table's unit belongs in its headers."""
SAMPLES = ("--samples", "5")

RUNS: dict[str, list[object]] = {
    "docs": ["docs"],
    "inspect-demo": ["inspect", DEMO],
    "inspect-ddp": ["inspect", RESNET_IN_REPO],
    "schedule-tic": ["schedule", "-a", "tic", DEMO],
    "schedule-tac": ["schedule", "-a", "tac", DEMO],
    "schedule-caramel": ["schedule", "-a", "caramel", RESNET_IN_REPO],
    "metrics-demo": ["metrics", DEMO],
    "metrics-ddp": ["metrics", RESNET_IN_REPO],
    "metrics-groups": ["metrics", REPO / "traces" / "torch" / "tp_dp_2x2"],
    "metrics-fsdp": ["metrics", REPO / "traces" / "torch" / "fsdp" / "fsdp1_prefetch"],
    "simulate-demo": ["simulate", DEMO, *SAMPLES, "--sweep", "bandwidth-scale=0.5:2:3"],
    "simulate-ddp": ["simulate", RESNET_IN_REPO, *SAMPLES],
    "analyze-demo": ["analyze"],
    "analyze-ddp": ["analyze", RESNET_IN_REPO],
    "model-demo": ["model", DEMO],
    "model-ddp": ["model", RESNET_IN_REPO],
    "analyze-ranks-ddp": ["analyze-ranks", RESNET_IN_REPO, "-j", "1"],
    "fit-network": ["fit-network", NET_CSV],
}
"""Each command that prints tables, on the inputs it takes (verify: below)."""

NO_TABLES = {
    "convert": "prints the planner.trace/1 JSON document",
    "report": "writes an HTML page and says so on stderr",
    "export": "one line: the edges it added and the file it wrote",
    "bench-network": "runs torch.distributed processes; its table is fit-network's kind",
}
"""Commands not rendered here, each with why."""


def _check_fits(text: str, columns: int, label: str) -> None:
    """No line of `text` wider than `columns`, no cell cut."""
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, f"{label}: {len(wide)} line(s) over {columns} columns:\n" + "\n".join(wide)
    cut = [line for line in text.splitlines() if "…" in line]
    assert not cut, f"{label}: cut cells:\n" + "\n".join(cut)


def test_every_command_with_tables_is_checked() -> None:
    """A new command gets a width check here, or a reason it needs none."""
    from planner_cli.main import cli

    checked = {args[0] for args in RUNS.values()} | {"verify"}
    assert checked | set(NO_TABLES) == set(cli.commands)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_command_fits_80_columns(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The default output and the `--detail` one: every line within 80 columns, no figure
    or header cut, whatever the command leaves out said in one closing line."""
    for extra in ([], ["--detail"]):
        code, out, err = run_cli([*RUNS[name], *extra], capsys, columns=80)
        assert code == 0, err
        assert out.strip(), f"{name}: no text output"
        _check_fits(out, 80, f"{name} {' '.join(extra)}")
        _check_fits(err, 80, f"{name} {' '.join(extra)} (stderr)")
        cells = [line for line in out.splitlines() if UNIT_IN_CELL.search(line)]
        assert not cells, f"{name}: a unit in a cell, not the header:\n" + "\n".join(cells)
        if not extra:
            _check_page_names_the_options(RUNS[name][0], out)


def _check_page_names_the_options(command: str, out: str) -> None:
    """Where the output leaves tables or columns out (its closing line says so), the
    command's page in docs/commands names the option that brings them back."""
    page = (REPO / "docs" / "commands" / f"{command}.md").read_text(encoding="utf-8")
    for option in ("--detail", "--wide"):
        if f"{option} adds" in out:
            assert option in page, f"docs/commands/{command}.md does not mention {option}"


def test_notes_on_stderr_wrap_as_paragraphs(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's warnings (each a 300-character line before) are wrapped to COLUMNS, one
    paragraph each: a first line flush left, the rest indented; joined, each is the text
    the JSON carries. With --json nothing is said on stderr."""
    code, out, err = run_cli(["simulate", DEMO, *SAMPLES], capsys, columns=60)
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) > 2 and max(len(line) for line in lines) <= 60
    starts = [i for i, line in enumerate(lines) if not line.startswith("  ")]
    assert all(lines[i].startswith("worker0: ") for i in starts)
    notes = [
        " ".join(" ".join(lines[a:b]).split())
        for a, b in zip(starts, [*starts[1:], None], strict=True)
    ]
    code, raw, json_err = run_cli(["simulate", DEMO, *SAMPLES, "--json"], capsys, columns=60)
    assert code == 0 and json_err == ""
    rank = json.loads(raw)["comparison"]["ranks"][0]
    cautions = {(p.get("replayed") or {}).get("caution") for p in rank["plans"]} - {None}
    assert f"worker0: {rank['comparison_warning']}" in notes
    assert notes[-1] == f"worker0: replayed: {cautions.pop()}"


def test_a_written_file_stays_on_its_line() -> None:
    """`wrote PATH` is never split between the verb and a path longer than the line; a
    long note breaks between words only."""
    from planner_cli.terminal import paragraph

    path = "/tmp/" + "x" * 90 + "/report.json"
    assert paragraph(f"wrote {path}", 80) == f"wrote {path}"
    text = "rank0: " + " ".join(f"word{i}" for i in range(40))
    wrapped = paragraph(text, 40).splitlines()
    assert max(map(len, wrapped)) <= 40 and all(line.startswith("  ") for line in wrapped[1:])
    assert " ".join(" ".join(wrapped).split()) == text


def test_verify_fits_80_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify` of the demo against its own TAC plan: a long first violation folds."""
    plan = tmp_path / "plan.json"
    assert run_cli(["schedule", "-a", "tac", DEMO, "-o", plan], capsys)[0] == 0
    code, out, err = run_cli(["verify", plan, DEMO], capsys, columns=80)
    assert code == 0 and "first" in out, err
    _check_fits(out, 80, "verify")


def test_detail_prints_the_tables_the_default_leaves_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`analyze` answers with the verdict and the plans' predicted times; the metrics,
    each plan's first transfers and the replay per step come with `--detail`, which the
    closing line names. `--detail` after the command, as the group's other options."""
    hidden = ("Scheduling efficiency per step", "Transfer order per plan", "Replay of the")
    code, default, err = run_cli(["analyze"], capsys)
    assert code == 0, err
    code, detailed, err = run_cli(["analyze", "--detail"], capsys)
    assert code == 0, err
    assert "Predicted iteration time of worker0" in default
    assert not any(title in default for title in hidden)
    assert all(title in detailed for title in hidden)
    closing = " ".join(default.split()).rsplit("--detail adds ", 1)[1]
    assert closing.startswith("the metrics tables, each plan's first transfers")
    assert "--detail adds" not in detailed


def test_wide_keeps_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    """At 80 columns `metrics` leaves out idle and Lmin and says so; `--wide` prints them,
    on lines as long as they need."""
    code, narrow, err = run_cli(["metrics", DEMO], capsys, columns=80)
    assert code == 0, err
    header = next(line for line in narrow.splitlines() if "Umax" in line)
    assert " E " in header and " idle " not in header and " Lmin " not in header
    assert "--wide adds the columns idle (ms), Lmin (ms)" in " ".join(narrow.split())
    code, wide, err = run_cli(["--wide", "metrics", DEMO], capsys, columns=80)
    assert code == 0, err
    header = next(line for line in wide.splitlines() if "Umax" in line)
    assert " idle " in header and " Lmin " in header and " queued " in header
    assert max(len(line) for line in wide.splitlines()) > 80 and "--wide adds" not in wide


def _piped(args: list[str], columns: str | None) -> str:
    """`planner ARGS` in a fresh process, its stdout a pipe, COLUMNS as given (unset:
    None) and no terminal on any stream."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({} if columns is None else {"COLUMNS": columns})
    code = "import sys; from planner_cli.main import main; main(sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, stdin=subprocess.DEVNULL, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_columns_is_honoured_when_piped() -> None:
    """Piped, `inspect` of the demo takes COLUMNS=120 (its widest line uses it); without
    COLUMNS, 80 (it was 160 whatever COLUMNS said)."""
    lines = _piped(["inspect", str(DEMO)], "120").splitlines()
    assert 80 < max(len(line) for line in lines) <= 120
    _check_fits("\n".join(lines), 120, "inspect at 120")
    lines = _piped(["inspect", str(DEMO)], None).splitlines()
    assert max(len(line) for line in lines) <= 80
