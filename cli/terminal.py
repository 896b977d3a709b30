"""The text output's consoles and how its tables fit them (issue #46 point 4).

Every table fits the console's width: the columns a view names as secondary are left out,
least needed first, until the rest fit as they are, then names fold onto more lines;
numbers never wrap nor are cut. `--wide` keeps every column (lines as long as they need),
`--detail` prints the tables and paragraphs a command's default output leaves out; one
closing line says what each would add.

The width is rich's: ``COLUMNS`` when set (piped or not), else the terminal's that stdin,
stdout or stderr is, else 80. rich is imported on first output, so that `--version`,
`--help` and `--json` never import it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

Unit = tuple[str, float, int]
"""A table's time unit: its name, seconds x scale, and the decimals its cells show."""

NATURAL = 100_000
"""A width no table reaches: a table measured in it takes its natural width."""

_state: dict[str, Any] = {}


def configure(no_color: bool = False, detail: bool = False, wide: bool = False) -> None:
    """Remember the group's output options; the consoles are made on first output."""
    _state.clear()
    _state.update(no_color=no_color, detail=detail, wide=wide, columns={}, sections={})


def out() -> Console:
    """The console for stdout: rich's width (``COLUMNS``, a terminal's, else 80)."""
    if "out" not in _state:
        from rich.console import Console

        _state["out"] = Console(
            no_color=_state.get("no_color", False), highlight=False, soft_wrap=False
        )
    return _state["out"]


def err() -> Console:
    """The console for stderr (progress bars; its width is the notes')."""
    if "err" not in _state:
        from rich.console import Console

        _state["err"] = Console(
            stderr=True, no_color=_state.get("no_color", False), highlight=False
        )
    return _state["err"]


def paragraph(text: str, width: int) -> str:
    """`text` (a note or a warning) wrapped to `width` columns as one paragraph: its lines
    after the first indented by two spaces, words never cut (a path longer than a line
    takes the line it needs). A path after the first word stays beside it: ``wrote
    PATH``, ``skipped PATH: ...`` keep their verb and path on one line."""
    lines: list[str] = []
    for part in text.splitlines() or [""]:
        first, _, rest = part.partition(" ")
        if "/" in rest.split(" ", 1)[0]:  # the space kept by textwrap: a no-break one
            part = f"{first}\N{NO-BREAK SPACE}{rest}"
        wrapped = textwrap.wrap(
            part, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
        lines.extend(line.replace("\N{NO-BREAK SPACE}", " ") for line in wrapped or [""])
    return "\n".join(lines)


def detail(what: str) -> bool:
    """Whether to print `what`, a table or paragraph outside the command's answer: with
    `--detail`; else it is named in the closing line."""
    if _state.get("detail"):
        return True
    _state.setdefault("sections", {})[what] = None
    return False


def number_column(table: Table, header: str) -> None:
    """A right-aligned column of figures: never wrapped (a cut figure would show ``…``,
    which the width test looks for)."""
    table.add_column(header, justify="right", no_wrap=True)


def text_column(table: Table, header: str) -> None:
    """A column of names: folded onto more lines where the table is too wide."""
    table.add_column(header, overflow="fold")


def show(table: Table, secondary: Sequence[str] = ()) -> None:
    """Print `table` within the console's width: the columns headed `secondary` (least
    needed first) are left out one at a time until the table fits at its natural width;
    with `--wide` all are kept and the table takes the width it needs."""
    console = out()
    wide = _state.get("wide", False)
    for header in () if wide else secondary:
        if natural_width(console, table) <= console.width:
            break
        column = next((c for c in table.columns if c.header == header), None)
        if column is not None:
            table.columns.remove(column)
            _state.setdefault("columns", {})[" ".join(header.split())] = None
    _headers_on_top(table)
    width = console.width
    if wide:
        console.width = max(width, natural_width(console, table))
    try:
        console.print(table)
    finally:
        console.width = width


def _headers_on_top(table: Table) -> None:
    """Headers of one line level with the first line of those with a unit under them
    (rich aligns a header row at its bottom)."""
    lines = max(str(c.header).count("\n") for c in table.columns) if table.columns else 0
    for column in table.columns:
        column.header = str(column.header) + "\n " * (lines - str(column.header).count("\n"))


def natural_width(console: Console, table: Table) -> int:
    """The width `table` takes when nothing constrains it."""
    return console.measure(table, options=console.options.update_width(NATURAL)).maximum


def closing_line() -> None:
    """After a text output: what `--wide` and `--detail` would add to it (nothing when
    no console was made: JSON, an error)."""
    if "out" not in _state:
        return
    parts = []
    if _state.get("columns"):
        parts.append(f"--wide adds the columns {', '.join(_state['columns'])}")
    if _state.get("sections"):
        parts.append(f"--detail adds {', '.join(_state['sections'])}")
    if parts:
        from rich.text import Text

        out().print(Text("; ".join(parts), style="dim"))


def time_unit(values: Iterable[float | None]) -> Unit:
    """One unit for a table's times, named in its headers: s where every (non-zero) time
    is 1 s or more, µs where every one is under 1 ms, else ms."""
    seen = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if seen and min(seen) >= 1:
        return ("s", 1.0, 3)
    if seen and max(seen) < 1e-3:
        return ("µs", 1e6, 1)
    return ("ms", 1e3, 2)


def time_cell(value: float | None, unit: Unit) -> str:
    """A time in the table's unit; "-" when unknown, ∞ when infinite."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value * unit[1]:.{unit[2]}f}"


def with_unit(name: str, unit: Unit | str) -> str:
    """A header with its unit on a second line (the column as narrow as its figures)."""
    return f"{name}\n({unit if isinstance(unit, str) else unit[0]})"
