"""The errors the CLI turns into a single line: bad input (exit status 2) and a worker
process that died (exit status 1). Both cross process boundaries (a pool or Dask
worker) with their fields: pickled by their arguments, not by their message."""

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

    def __reduce__(self) -> tuple[type, tuple[str | None, str]]:
        return (type(self), (self.path, self.problem))


class WorkerDied(Exception):
    """A worker process died (a signal, out of memory) while it analysed a rank: not bad
    input, so exit status 1. `str()` names the rank's input, as `InputError` does."""

    def __init__(self, path: str | Path | None, how: str) -> None:
        self.path = str(path) if path is not None else None
        self.how = how
        problem = f"the worker process analysing it died ({how})"
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self) -> tuple[type, tuple[str | None, str]]:
        return (type(self), (self.path, self.how))
