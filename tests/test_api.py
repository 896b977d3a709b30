"""The Python API equals the CLI: docs/api.md's examples run, results are dataclasses with
to_dict() (the --json document) and to_frame(), help(planner) lists the functions, and
`import planner` stays cheap."""

from __future__ import annotations

import dataclasses
import json
import pydoc
import re
from pathlib import Path

import pytest

import planner
from tests.conftest import DEMO, REPO, RESNET_IN_REPO, run_cli
from tests.test_schemas import validate

API_PAGE = REPO / "docs" / "api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", API_PAGE.read_text(encoding="utf-8"), re.S)


def test_api_page_examples_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    blocks = _blocks()
    assert len(blocks) >= 4
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(API_PAGE), "exec"), namespace)
    assert "use Caramel" in capsys.readouterr().out


def test_help_lists_the_api() -> None:
    text = pydoc.render_doc(planner, renderer=pydoc.plaintext)
    for call in ("planner.load(", "planner.inspect(job)", "planner.metrics(job)",
                 "planner.schedule(job, ", "planner.simulate(job, plans)",
                 "planner.report(job, "):  # fmt: skip
        assert call in text, call


def test_results_equal_the_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    job = planner.load([DEMO])
    cli = {
        "metrics": json.loads(run_cli(["metrics", DEMO, "--json"], capsys)[1]),
        "inspect": json.loads(run_cli(["inspect", DEMO, "--json"], capsys)[1]),
        "schedule": json.loads(run_cli(["schedule", DEMO, "-a", "tic", "--json"], capsys)[1]),
    }
    api = {
        "metrics": planner.metrics(job),
        "inspect": planner.inspect(job),
        "schedule": planner.schedule(job, "tic"),
    }
    for name, result in api.items():
        assert dataclasses.is_dataclass(result)
        document = result.to_dict()
        validate(document)
        assert document == cli[name], name
    frame = api["metrics"].to_frame()
    assert len(frame) == len(cli["metrics"]["steps"])
    assert frame["efficiency"].tolist() == [s["efficiency"] for s in cli["metrics"]["steps"]]
    assert frame["queued"].tolist() == [s["queued"] for s in cli["metrics"]["steps"]]  # TF


def test_simulate_defaults_to_every_applicable_plan_and_validates() -> None:
    job = planner.load(RESNET_IN_REPO)
    result = planner.simulate(job, samples=3)
    validate(result.to_dict())
    plans = set(result.to_frame()["plan"])
    assert plans == {"baseline", "observed", "caramel"}
    replay = result.replay_frame()
    assert set(replay["rank"]) == {"rank0", "rank1"} and replay["replay_error"].notna().all()


def test_report_writes_what_analyze_writes(tmp_path: Path, capsys) -> None:
    job = planner.load([DEMO])
    report = planner.report(job, tmp_path / "api", samples=5)
    status, _, err = run_cli(["analyze", DEMO, "-o", tmp_path / "cli"], capsys)
    assert status == 0, err
    assert sorted(p.name for p in report.files) == sorted(
        p.name for p in (tmp_path / "cli").iterdir()
    )
    validate(json.loads((tmp_path / "api" / "report.json").read_text()))
    # the CLI's rule: earlier results are replaced only with force; a short repr
    with pytest.raises(planner.InputError, match="pass --force"):
        planner.report(job, tmp_path / "api", samples=5)
    again = planner.report(job, tmp_path / "api", samples=5, force=True)
    assert repr(again).startswith("Report(verdict='Keep what you have") and len(repr(again)) < 400


def test_bad_input_raises_one_line_input_error(tmp_path: Path) -> None:
    broken = tmp_path / "rank0.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(planner.InputError) as info:
        planner.load(broken)
    assert str(broken) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(planner.InputError, match="no rank 'worker9'"):
        planner.load(DEMO, rank="worker9")


def test_library_modules_stay_importable_and_the_api_names_stay_functions() -> None:
    from planner.measure.metrics import efficiency
    from planner.planning import tictac
    from planner.prediction.comparison import KNOBS

    assert efficiency(3.0, 1.0, 2.0) == 0.5 and KNOBS and tictac.tac
    import planner.measure.metrics
    import planner.planning.tictac
    import planner.prediction.simulate
    import planner.reporting  # noqa: F401 (a stage package imported beside the façade)

    for name in ("metrics", "schedule", "simulate", "report"):
        function = getattr(planner, name)
        assert callable(function) and function.__module__ == "planner.api", name
