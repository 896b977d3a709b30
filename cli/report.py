"""`planner report RESULT_DIR`: the HTML report of an `analyze -o RESULT_DIR` result."""

from __future__ import annotations

import json
from pathlib import Path

import click

from planner.errors import InputError
from planner.export.files import write_atomic
from planner_cli import render
from planner_cli.options import json_option

SCHEMA = "planner.report_html/1"


def result_files(result_dir: Path, html_name: str = "report.html") -> list[str]:
    """Names of the files in `result_dir` (no hidden temp files), plus the HTML page itself."""
    names = {p.name for p in result_dir.iterdir() if p.is_file() and not p.name.startswith(".")}
    names.add(html_name)
    return sorted(names)


def read_report(result_dir: Path) -> dict:
    """RESULT_DIR/report.json as a dict; InputError (exit 2) when absent or not a report."""
    path = result_dir / "report.json"
    if not path.is_file():
        raise InputError(path, "no report.json here (write one with `planner analyze -o DIR`)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"not valid JSON: {exc}") from None
    schema = document.get("schema") if isinstance(document, dict) else None
    if not isinstance(schema, str) or not schema.startswith("planner.report/"):
        raise InputError(path, f"not a planner report (schema {schema!r})")
    return document


@click.command("report")
@click.argument(
    "result_dir", type=click.Path(path_type=Path, file_okay=False), metavar="RESULT_DIR"
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the page here instead of RESULT_DIR/report.html.",
)
@json_option
def report_command(result_dir: Path, output: Path | None, as_json: bool) -> None:
    """Write RESULT_DIR/report.html from report.json: self-contained, plots inline, offline."""
    from planner.reporting.html import render_html

    document = read_report(result_dir)
    target = output if output is not None else result_dir / "report.html"
    files = result_files(result_dir, target.name if target.parent == result_dir else "")
    shown = [f for f in files if f]
    page = render_html(document, files=shown, title="planner report")
    write_atomic(target, page)
    if as_json:
        size = len(page.encode())
        summary = {"schema": SCHEMA, "html": str(target), "bytes": size, "files": files}
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    render.note(f"wrote {target}", as_json)
