"""`planner docs`, the bundled demos by name, and two options that say their unit and
meaning (issue #46, points 3 and 5): `metrics --max-straggler` in ms, `model
--worker-counts` (its old name `--workers` a hidden alias that warns)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import click
import pytest

import planner
from tests.conftest import DEMO, REPO, RESNET_IN_REPO, run_cli
from tests.test_schemas import validate

DOCS = REPO / "docs"


def _help_texts() -> list[str]:
    """Every help text of the CLI: the group's, each command's and each option's."""
    from planner_cli.main import cli

    texts = [cli.help or "", *(p.help or "" for p in cli.params if isinstance(p, click.Option))]
    for command in cli.commands.values():
        texts.append(command.help or "")
        texts += [p.help or "" for p in command.params if isinstance(p, click.Option)]
    return texts


def test_docs_lists_every_page_and_prints_each(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["docs"], capsys)
    assert code == 0, err
    pages = [*DOCS.glob("*.md"), *(DOCS / "commands").glob("*.md")]
    assert len(pages) > 20
    for page in pages:
        assert re.search(rf"\b{re.escape(page.stem)}\b", out), page.stem
    code, text, _ = run_cli(["docs", "formats"], capsys)
    assert code == 0 and text == (DOCS / "formats.md").read_text(encoding="utf-8")
    code, text, _ = run_cli(["docs", "commands/analyze"], capsys)
    assert text == (DOCS / "commands" / "analyze.md").read_text(encoding="utf-8")
    code, where, _ = run_cli(["docs", "parallel", "--path"], capsys)
    assert Path(where.strip()).resolve() == (DOCS / "parallel.md").resolve()


def test_every_page_a_help_text_cites_is_there(capsys: pytest.CaptureFixture[str]) -> None:
    """No help text points at a repo path (`docs/X.md`) an installed package lacks; each
    `planner docs X` it names prints a page."""
    texts = _help_texts()
    assert not [t for t in texts if re.search(r"docs/[\w/-]+\.md", t)]
    cited = {m for t in texts for m in re.findall(r"planner docs ([a-z-]+)", t)}
    assert {"formats", "parallel"} <= cited
    for topic in cited:
        code, out, err = run_cli(["docs", topic], capsys)
        assert code == 0 and out.startswith("# "), (topic, err)


def test_an_unknown_topic_is_one_line_listing_the_topics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(["docs", "formatz"], capsys)
    assert code == 2 and not out
    assert err.count("\n") == 1 and "formats" in err and "getting-started" in err, err
    code, out, err = run_cli(["docs", "--schemas", "planner.nothing/1"], capsys)
    assert code == 2 and not out and err.count("\n") == 1 and "planner.report/1" in err


def test_docs_lists_and_prints_the_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["docs", "--schemas"], capsys)
    files = sorted((DOCS / "schemas").glob("*.json"))
    assert code == 0 and len(files) > 15
    for path in files:
        assert path.stem.rpartition(".")[0] + "/" + path.stem.rpartition(".")[2] in out
    for name in ("planner.metrics/1", "metrics", "planner.metrics.1.json"):
        code, text, _ = run_cli(["docs", "--schemas", name], capsys)
        assert json.loads(text) == json.loads(
            (DOCS / "schemas" / "planner.metrics.1.json").read_text()
        )
    code, out, _ = run_cli(["docs", "ci", "--json"], capsys)
    document = json.loads(out)
    validate(document)
    assert document["page"]["text"] == (DOCS / "ci.md").read_text(encoding="utf-8")
    assert len(document["schemas"]) == len(files)


@pytest.mark.parametrize(("name", "folder"), [("demo", DEMO), ("demo-ddp", RESNET_IN_REPO)])
def test_a_demo_by_name_is_its_folder(
    name: str, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_name = run_cli(["inspect", name, "--json"], capsys)
    by_path = run_cli(["inspect", folder, "--json"], capsys)
    assert by_name[0] == 0 and by_name[1] == by_path[1]
    assert "skipped" not in by_name[2]  # the demos' own metadata files are no trace to skip
    ranks = [r["rank"] for r in json.loads(by_path[1])["ranks"]]
    assert planner.load(name).ranks == ranks  # the API takes the name too


def test_a_folder_named_demo_here_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    worker1 = REPO / "traces" / "tf" / "mlp_ps_betweengraph_sync" / "worker1"
    shutil.copytree(worker1, tmp_path / "demo")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["inspect", "demo", "--json"], capsys)
    assert code == 0, err
    assert all(Path(s).parent.name == "demo" for s in json.loads(out)["sources"])
    assert [r["rank"] for r in json.loads(out)["ranks"]] == ["worker1"]


def test_verify_and_analyze_take_the_demo_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "tac.json"
    assert run_cli(["schedule", "demo", "-a", "tac", "-o", plan], capsys)[0] == 0
    code, out, err = run_cli(["verify", plan, "demo", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["ranks"][0]["steps"] == 5
    # `analyze demo -o` replaces the demo's earlier output, as `analyze -o` does
    target = tmp_path / "out"
    target.mkdir()
    earlier = {"schema": "planner.report/1", "inspect": {"sources": [str(DEMO / "x.pb")]}}
    (target / "report.json").write_text(json.dumps(earlier))
    code, _, err = run_cli(["analyze", "demo", "-o", target], capsys)
    assert code == 0, err
    assert json.loads((target / "report.json").read_text())["inspect"]["sources"][0] != str(
        DEMO / "x.pb"
    )


def test_max_straggler_is_in_ms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate takes ms, as every table shows a time (or a unit suffix); the JSON keeps
    seconds; the failure line and the Markdown say ms."""
    code, out, _ = run_cli(["metrics", RESNET_IN_REPO, "-j", "1", "--json"], capsys)
    worst = max(s["straggler_time"] for s in json.loads(out)["allreduce"]["stragglers"])
    below = f"{worst * 1e3 * 0.99:.3f}"
    markdown = tmp_path / "m.md"
    args = ["metrics", RESNET_IN_REPO, "-j", "1", "--markdown", markdown]
    code, out, err = run_cli([*args, "--max-straggler", below], capsys)
    assert code == 1 and f"> {float(below):g} ms" in err, err
    assert f"`max-straggler {float(below):g}ms`" in markdown.read_text()
    assert "straggler (ms)" in markdown.read_text()
    code, out, _ = run_cli([*args[:4], "--max-straggler", f"{worst * 1.01:.6f}s", "--json"], capsys)
    assert code == 0 and json.loads(out)["gate"]["max_straggler"] == pytest.approx(worst * 1.01)
    code, out, _ = run_cli([*args[:4], "--max-straggler", f"{worst * 1e6 * 1.01:.0f}us"], capsys)
    assert code == 0
    code, out, err = run_cli([*args[:4], "--max-straggler", "fast"], capsys)
    assert code == 2 and not out and err.count("\n") == 1, err


def test_model_worker_counts_and_its_old_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, new, err = run_cli(["model", DEMO, "--worker-counts", "1,2,4", "--json"], capsys)
    assert code == 0 and not err and json.loads(new)["workers"] == [1, 2, 4]
    code, old, err = run_cli(["model", DEMO, "--workers", "1,2,4", "--json"], capsys)
    assert code == 0 and old == new
    assert "deprecated" in err and "--worker-counts" in err and err.count("\n") == 1
    code, out, err = run_cli(["model", DEMO, "--worker-counts", "1", "--workers", "2"], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    code, out, _ = run_cli(["model", "--help"], capsys)
    assert "--worker-counts" in out and "--workers" not in out
