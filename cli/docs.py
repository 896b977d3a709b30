"""`planner docs`: the documentation pages and JSON schemas shipped with the package.

The repository's docs/ is installed as the data package `planner.docs` (pyproject's
package-dir mapping), so that an installed `planner` reaches what its help texts cite.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import click

from planner.errors import InputError
from planner.export.files import dumps
from planner_cli.options import json_option


def docs_root() -> Path:
    """The docs folder: the installed data package `planner.docs`, else (a source
    checkout) the repository's docs/."""
    from importlib.util import find_spec

    try:
        spec = find_spec("planner.docs")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[1] / "docs"


def pages(root: Path) -> dict[str, dict[str, Path]]:
    """The pages by topic name, in two groups: guides (docs/*.md) and commands
    (docs/commands/*.md, one per command)."""
    return {
        "guides": {p.stem: p for p in sorted(root.glob("*.md"), key=lambda p: p.stem)},
        "commands": {
            p.stem: p for p in sorted((root / "commands").glob("*.md"), key=lambda p: p.stem)
        },
    }


def find_page(root: Path, topic: str) -> Path | None:
    """The page of `topic` (``formats``, ``analyze``, ``commands/analyze``, with or
    without ``.md``): a guide before a command of the same name."""
    name = topic.removesuffix(".md")
    groups = pages(root)
    if name.startswith("commands/"):
        return groups["commands"].get(name.removeprefix("commands/"))
    return groups["guides"].get(name) or groups["commands"].get(name)


def schemas(root: Path) -> dict[str, Path]:
    """The JSON schemas by the `schema` id a document carries (``planner.report/1``)."""
    found = {}
    for path in sorted((root / "schemas").glob("planner.*.json")):
        stem, _, version = path.stem.rpartition(".")
        found[f"{stem}/{version}"] = path
    return found


def find_schema(root: Path, name: str) -> Path | None:
    """The schema `name`: its id (``planner.report/1``), its file name, or the bare kind
    (``report``, ``planner.report``: the latest version)."""
    known = schemas(root)
    key = name.removesuffix(".json")
    stem, _, version = key.rpartition(".")
    for candidate in (key, f"{stem}/{version}"):
        if candidate in known:
            return known[candidate]
    kind = key if key.startswith("planner.") else f"planner.{key}"
    versions = [ident for ident in known if ident.rpartition("/")[0] == kind]
    return known[max(versions, key=lambda i: int(i.rpartition("/")[2]))] if versions else None


def _title(path: Path) -> str:
    if path.suffix == ".json":
        return str(json.loads(path.read_text(encoding="utf-8")).get("title", ""))
    with path.open(encoding="utf-8") as handle:
        return handle.readline().lstrip("# ").strip()


def index(root: Path) -> dict[str, Any]:
    """`planner.docs/1`: the folder, and every page and schema with its title and file."""
    groups = pages(root)

    def entries(found: dict[str, Path], key: str) -> list[dict[str, str]]:
        return [{key: name, "title": _title(p), "path": str(p)} for name, p in found.items()]

    return {
        "schema": "planner.docs/1",
        "folder": str(root),
        "guides": entries(groups["guides"], "topic"),
        "commands": entries(groups["commands"], "topic"),
        "schemas": entries(schemas(root), "id"),
    }


def _listing(document: dict[str, Any]) -> None:
    guides = document["guides"]
    width = max(len(g["topic"]) for g in guides)
    columns = shutil.get_terminal_size((80, 24)).columns  # COLUMNS when set
    indent = " " * (width + 4)
    lines = ["Guides:"]
    for g in guides:  # a long title folds under itself
        lines.append(textwrap.fill(f"  {g['topic']:<{width}}  {g['title']}", max(columns, 40),
                                   subsequent_indent=indent))  # fmt: skip
    lines += [
        "Commands, one page each:",
        textwrap.fill(", ".join(c["topic"] for c in document["commands"]), 78,
                      initial_indent="  ", subsequent_indent="  "),
        "",
        "planner docs TOPIC prints a page as Markdown (--path: where it is);",
        "planner docs --schemas lists the JSON schemas of the --json outputs.",
        f"Folder: {document['folder']}",
    ]  # fmt: skip
    click.echo("\n".join(lines))


def _schema_listing(document: dict[str, Any]) -> None:
    found = document["schemas"]
    width = max(len(s["id"]) for s in found)
    for entry in found:
        click.echo(f"{entry['id']:<{width}}  {entry['title']}".rstrip())
    click.echo(f"\nplanner docs --schemas ID prints one. Folder: {document['folder']}/schemas")


@click.command("docs")
@click.argument("topic", required=False)
@click.option("--path", "show_path", is_flag=True, help="Print where the page is, not the page.")
@click.option(
    "--schemas",
    "want_schemas",
    is_flag=True,
    help="The JSON schemas of every --json output: list them, or with TOPIC (e.g. "
    "planner.report/1, report) print that one.",
)
@json_option
def docs_command(topic: str | None, show_path: bool, want_schemas: bool, as_json: bool) -> None:
    """The documentation shipped with planner: no TOPIC lists the pages; TOPIC (e.g.
    formats, parallel, analyze) prints one as Markdown.

    --json prints the index (`planner.docs/1`), with the page's text under `page` when
    TOPIC is given."""
    root = docs_root()
    if not (root / "getting-started.md").is_file():
        raise InputError(root, "the documentation is not installed with this planner")
    document = index(root)
    found = _find(root, topic, want_schemas, document) if topic is not None else None
    if as_json:
        if found is not None:
            text = found.read_text(encoding="utf-8")
            document["page"] = {"topic": topic, "path": str(found), "text": text}
        click.echo(dumps(document), nl=False)
    elif show_path:
        click.echo(found or (root / "schemas" if want_schemas else root))
    elif found is not None:
        click.echo(found.read_text(encoding="utf-8"), nl=False)
    else:
        (_schema_listing if want_schemas else _listing)(document)


def _find(root: Path, topic: str, want_schemas: bool, document: dict[str, Any]) -> Path:
    """The page or schema file `topic` names; a usage error listing them when none."""
    if want_schemas:
        path = find_schema(root, topic)
        names, what = [s["id"] for s in document["schemas"]], "schema"
    else:
        path = find_page(root, topic)
        names = [p["topic"] for p in (*document["guides"], *document["commands"])]
        what = "docs topic"
    if path is None:
        raise click.UsageError(f"no {what} {topic!r}; choose from: {', '.join(names)}")
    return path
