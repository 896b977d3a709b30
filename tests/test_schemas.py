"""Every `--json` output (and every JSON file written) validates against docs/schemas/."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from tests.conftest import DEMO, REPO, SHARED, need, run_cli

SCHEMAS = REPO / "docs" / "schemas"
TORCH = REPO / "traces" / "torch" / "resnet_ddp"
TF_CNN = SHARED / "generated" / "tf" / "cnn_ps_ingraph"


def _load_all() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))}


ALL = _load_all()
REGISTRY = Registry().with_resources(
    (name, Resource.from_contents(schema)) for name, schema in ALL.items()
)


def schema_file(kind: str) -> str:
    """``planner.report/1`` -> ``planner.report.1.json``."""
    return kind.replace("/", ".") + ".json"


def validate(document: dict[str, Any], kind: str | None = None) -> None:
    """Validate against the schema the document names (or `kind`)."""
    kind = kind or document["schema"]
    schema = ALL[schema_file(kind)]
    jsonschema.Draft202012Validator(schema, registry=REGISTRY).validate(document)


def cli_json(args: list[Any], capsys: pytest.CaptureFixture[str], code: int = 0) -> dict:
    status, out, err = run_cli([*args, "--json"], capsys)
    assert status == code, err
    return json.loads(out)


def test_schema_files_are_valid_schemas() -> None:
    assert ALL, "no schema in docs/schemas"
    for name, schema in ALL.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"] == name


def test_every_schema_string_in_the_code_has_a_schema_file() -> None:
    pattern = re.compile(r'"(planner\.[a-z_]+/\d+)"')
    kinds = set()
    for path in [*(REPO / "planner").rglob("*.py"), *(REPO / "cli").rglob("*.py")]:
        kinds.update(pattern.findall(path.read_text(encoding="utf-8")))
    assert {"planner.inspect/1", "planner.metrics/1", "planner.report/1"} <= kinds
    missing = sorted(k for k in kinds if schema_file(k) not in ALL)
    assert not missing, f"no schema in docs/schemas for {missing}"


def test_a_wrong_document_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    document = cli_json(["metrics", DEMO], capsys)
    validate(document)
    broken = copy.deepcopy(document)
    broken["steps"][0]["efficiency"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    del broken["steps"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


@pytest.mark.parametrize(
    "args",
    [["inspect", DEMO], ["schedule", DEMO, "--algorithm", "tic"], ["schedule", DEMO]],
    ids=["inspect", "schedule-tic", "schedule-tac"],
)
def test_demo_outputs(args: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    validate(cli_json(args, capsys))


def test_analyze_tf_and_report_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = cli_json(["analyze", need(TF_CNN), "-o", tmp_path], capsys)
    validate(report, "planner.report/1")
    assert report["metrics"]["allreduce"] is None
    for name in ("report.json", "priorities_tic.json", "priorities_tac.json"):
        validate(json.loads((tmp_path / name).read_text()))
    page = cli_json(["report", tmp_path], capsys)
    validate(page)
    assert "report.html" in page["files"]


def test_analyze_torch_has_allreduce(capsys: pytest.CaptureFixture[str]) -> None:
    report = cli_json(["analyze", need(TORCH)], capsys)
    validate(report)
    validate(report["metrics"]["allreduce"])
    assert report["metrics"]["allreduce"]["steps"]


def test_metrics_gate_output(capsys: pytest.CaptureFixture[str]) -> None:
    document = cli_json(["metrics", DEMO, "--min-efficiency", "0.99"], capsys, code=1)
    validate(document)
    assert document["gate"]["failed"]


def test_convert_writes_a_planner_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["convert", DEMO, "-o", tmp_path / "t.json"], capsys)
    assert status == 0, err
    validate(json.loads((tmp_path / "t.json").read_text()))


def test_simulate_with_sweep_and_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", DEMO, "--samples", "3", "--sweep", "bandwidth-scale=0.5:2:2"]
    document = cli_json([*args, "--timeline", tmp_path / "tl.json"], capsys)
    validate(document)
    assert document["sweep"]["ranks"]
    timeline = json.loads((tmp_path / "tl.json").read_text())
    validate(timeline, timeline["otherData"]["schema"])


def test_report_with_simulation_section() -> None:
    from planner.ingest import detect
    from planner.job import analysis

    report = analysis.analyze(detect.load([DEMO]))
    assert report["simulation"]["timelines"]
    validate(report)
    validate(report["simulation"])
    report["simulation"]["replay"]["ranks"][0]["steps"][0]["replay_error"] = "small"
    with pytest.raises(jsonschema.ValidationError):
        validate(report)


def test_model(capsys: pytest.CaptureFixture[str]) -> None:
    validate(cli_json(["model", DEMO, "--worker-counts", "1:4"], capsys))


def test_fit_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "net.csv"
    rows = [(64 * 4**k, 50e-6 + 64 * 4**k * 1e-9 * (1 + 0.01 * k)) for k in range(8)]
    csv.write_text("nbytes,seconds\n" + "".join(f"{n},{s}\n" for n, s in rows))
    document = cli_json(["fit-network", csv], capsys)
    validate(document)
    assert document["threshold_bytes"] > 0
