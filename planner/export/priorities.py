"""Priority files: planner JSON, CSV, and the `name<TAB>priority` text of TicTac.

The TicTac text gives each transfer its sender-counter number (`order_index`, in
[0, n)): the number of transfers that must be handed over before it (TicTac §5.1).
"""

from __future__ import annotations

import csv
import io
from typing import Any

CSV_COLUMNS = ("rank", "name", "param", "resource", "nbytes", "priority", "order_index")


def to_csv(document: dict[str, Any]) -> str:
    """One row per planned transfer, ranks in order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for rank in document["ranks"]:
        for t in rank["transfers"]:
            writer.writerow([rank["rank"], *(t[c] for c in CSV_COLUMNS[1:])])
    return out.getvalue()


def to_tictac(document: dict[str, Any], rank: str) -> str:
    """The TicTac enforcement list of one rank: ``name<TAB>order_index`` per line."""
    for entry in document["ranks"]:
        if entry["rank"] == rank:
            return "".join(f"{t['name']}\t{t['order_index']}\n" for t in entry["transfers"])
    raise KeyError(rank)
