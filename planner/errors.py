"""The one error type the CLI turns into exit status 2 and a single line."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input: a file that cannot be read, or content that makes no sense.

    `str()` is the line shown to the user: the file, then what is wrong with it.
    """

    def __init__(self, path: str | Path | None, problem: str) -> None:
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
