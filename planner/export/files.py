"""File output that is whole or absent, created with the user's umask, safely named.

- `write_atomic`: one file, written unnamed (or under a temporary name) beside it and
  renamed into place.
- `write_set`: a directory of files (`analyze -o`), written into a temporary directory
  beside it and swapped into place in one step (Linux `renameat2(RENAME_EXCHANGE)`,
  else two renames with a recovery on the next run). A lock beside it refuses a second
  concurrent writer. An existing directory is replaced only when it holds earlier
  planner results (or nothing) and `force` is given.
- `safe_name` / `file_names`: names from inputs (ranks, TF job names) made into file
  name parts: no path syntax, no control characters, no leading dot, bounded, unique.

A `kill -9` during `write_set` leaves the old set or the new one at the target. The files
are written unnamed (Linux `O_TMPFILE`) and only linked into the staging directory at
the end, so a writer killed while writing leaves nothing; one killed in the few link
and rename calls leaves a ``.NAME.planner-*`` directory that the next writer removes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from planner.errors import InputError

MAX_NAME_PART = 64
"""The longest file name part (characters) made from an input name."""

RESULT_MARKER = "report.json"
"""The file whose presence (a planner report) marks a directory as earlier results."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode(directory: bool) -> int:
    return (0o777 if directory else 0o666) & ~umask()


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) with the umask's permissions and write `data`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def check_file_target(path: str | Path) -> Path:
    """`path` as a place for one output file: InputError when it cannot be one.

    Refused: an existing directory, and a path below something that is not a directory.
    """
    target = Path(path)
    if target.is_dir():
        raise InputError(target, "is a directory; give a file name for this output")
    _check_parents(target)
    return target


def _check_parents(target: Path) -> None:
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(target, f"cannot be created: {parent} is not a directory")
            return


def check_dir_target(path: str | Path) -> Path:
    """`path` as a place for a set of output files: InputError when it cannot be one."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InputError(target, "exists and is not a directory; give a directory for -o")
    _check_parents(target)
    return target


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write `content` beside `path` under a temporary name, then rename it into place.

    The data is written to an unnamed file where Linux allows (`O_TMPFILE`) and named
    only to be renamed, so a writer killed while writing leaves nothing. The file gets
    the permissions a plain `open` would give (0666 less the umask).
    """
    target = check_file_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = _as_bytes(content)
    unnamed = _unnamed_files(target.parent, {target.name: data})
    import secrets  # the writers' modules load when a file is written (start-up, #18)

    tmp = target.parent / f".{target.name}.planner-{secrets.token_hex(6)}"
    try:
        if unnamed is None:
            _write_new(tmp, data)
        else:
            _name_unnamed(unnamed[target.name], tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for fd in (unnamed or {}).values():
            os.close(fd)


_PIECE = 1 << 16
"""Encoder chunks `dumps` joins at a time."""


def dumps(document: Any) -> str:
    """Deterministic JSON text (sorted keys, 2-space indent, trailing newline): the text
    of `json.dumps`, joined from `json_pieces`."""
    return "".join(json_pieces(document))


def json_pieces(document: Any) -> Iterator[str]:
    """The text of `dumps` in pieces of `_PIECE` encoder chunks each, in order.

    The indenting encoder yields a few small strings per value, and holding all of them
    at once (as `json.dumps` does) costs several times the text (a report of 1,000
    ranks); a reader of the pieces (a hash, a file) need not hold the text at all."""
    chunks = json.JSONEncoder(indent=2, sort_keys=True, allow_nan=False).iterencode(document)
    while batch := list(islice(chunks, _PIECE)):
        yield "".join(batch)
    yield "\n"


# ---------------------------------------------------------------------- names


def safe_name(name: str) -> str:
    """One input name as a file name part: `[A-Za-z0-9._+-]`, no leading dot, bounded.

    Other characters become ``_``; a name that had to change gets a short hash of the
    original so that two names never collapse into one (see `file_names`).
    """
    text = unicodedata.normalize("NFKC", str(name))
    cleaned = _UNSAFE.sub("_", text).lstrip(".") or "_"
    if cleaned == text and len(cleaned) <= MAX_NAME_PART:
        return cleaned
    import hashlib

    digest = hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned[: MAX_NAME_PART - 9]}-{digest}"


def file_names(names: Iterable[str]) -> dict[str, str]:
    """Each input name -> a distinct file name part (case-blind unique), in input order."""
    result: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        if name in result:
            continue
        part = safe_name(name)
        candidate, n = part, 1
        while candidate.lower() in taken:
            n += 1
            candidate = f"{part}-{n}"
        taken.add(candidate.lower())
        result[name] = candidate
    return result


# ---------------------------------------------------------------------- a set of files


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.planner-"


def _libc_renameat2() -> Any:
    import ctypes.util

    path = ctypes.util.find_library("c")
    if not path:
        return None
    try:
        func = ctypes.CDLL(path, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return func


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux); False where the system cannot."""
    func = _libc_renameat2()
    if func is None:
        return False
    done = func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    import ctypes

    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold the writer lock of `target` (a ``.NAME.planner-lock`` file beside it).

    The lock is an `flock`, released by the kernel when the process dies, so a lock
    file left by a killed writer does not block the next one (which removes it). A
    lock taken on a file that its holder has meanwhile removed is taken again.
    """
    lock = target.parent / f"{_staging_prefix(target)}lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(target, "another planner is writing it now; retry later") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _recover(target: Path) -> None:
    """Undo what a killed writer left beside `target` (the lock is held).

    After the two-rename fallback was cut between its renames, the old set sits in a
    ``.NAME.planner-old-*`` directory and the target is missing: put it back. Every
    other staging directory is an unfinished set: remove it.
    """
    prefix = _staging_prefix(target)
    for entry in sorted(target.parent.iterdir()):
        if not entry.name.startswith(prefix) or entry.name == f"{prefix}lock":
            continue
        if entry.name.startswith(f"{prefix}old-") and not target.exists():
            os.rename(entry, target)
            continue
        import shutil

        shutil.rmtree(entry, ignore_errors=True)


def _holds_results(directory: Path) -> bool:
    """Whether `directory` is empty or holds an earlier planner result set."""
    names = {entry.name for entry in directory.iterdir()}
    if not names:
        return True
    marker = directory / RESULT_MARKER
    if RESULT_MARKER not in names or not marker.is_file():
        return False
    try:
        if marker.stat().st_size > 1 << 28:
            return False
        document = json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    schema = document.get("schema") if isinstance(document, dict) else None
    return isinstance(schema, str) and schema.startswith("planner.report/")


def holds_demo_results(target: str | Path, demo: Path) -> bool:
    """Whether `target` holds an earlier `planner analyze` result set of the bundled demo
    (every source of its report.json inside `demo`): the quick start replaces its own
    output without --force, so that it can be run again (issue #46)."""
    marker = Path(target) / RESULT_MARKER
    try:
        if not marker.is_file() or marker.stat().st_size > 1 << 28:
            return False
        document = json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    sources = ((document.get("inspect") or {}) if isinstance(document, dict) else {}).get("sources")
    root = str(demo.resolve())
    return bool(sources) and all(
        isinstance(s, str) and str(Path(s).resolve().parent) == root for s in sources
    )


def check_set_target(target: str | Path, force: bool) -> Path:
    """`target` as a place for a set of files (`write_set`): InputError when it is not.

    Callers run it before their work too, so that a refusal comes before the cost.
    """
    out = check_dir_target(target)
    if out.exists():
        if not _holds_results(out):
            raise InputError(
                out, "holds files that are not planner results; give a new or empty directory"
            )
        if not force and any(out.iterdir()):
            raise InputError(out, "holds earlier results; pass --force to replace them")
    return out


def write_set(target: str | Path, files: Mapping[str, str | bytes], force: bool = False) -> None:
    """Write `files` (name -> content) as the directory `target`, whole or not at all.

    The names must be plain file names (no separators). An existing `target` is
    replaced as a set when `force` is given and it is empty or holds earlier planner
    results (a ``report.json``); otherwise InputError, and nothing is written.
    """
    out = check_dir_target(target)
    for name in files:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"not a plain file name: {name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        _recover(out)
        check_set_target(out, force)
        unnamed = _unnamed_files(out.parent, files)
        import shutil
        import tempfile

        staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(out)}new-", dir=out.parent))
        try:
            for name, content in files.items():
                if unnamed is None:
                    _write_new(staging / name, _as_bytes(content))
                else:  # written already: only named now, in a few fast link calls
                    _name_unnamed(unnamed[name], staging / name)
            os.chmod(staging, _mode(directory=True))
            _fsync_dir(staging)
            _swap_in(staging, out)
            _fsync_dir(out.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            for fd in (unnamed or {}).values():
                os.close(fd)


def _unnamed_files(directory: Path, files: Mapping[str, str | bytes]) -> dict[str, int] | None:
    """Each file written, fsynced and still unnamed (Linux `O_TMPFILE`): name -> fd.

    A writer killed while writing then leaves nothing behind: the kernel frees unnamed
    files. None where the system or file system cannot (the files are then written into
    the staging directory directly).
    """
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not Path("/proc/self/fd").is_dir():
        return None
    opened: dict[str, int] = {}
    try:
        for name, content in files.items():
            fd = os.open(directory, flag | os.O_WRONLY | os.O_CLOEXEC, 0o666)
            opened[name] = fd
            data = _as_bytes(content)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
    except OSError as exc:
        for fd in opened.values():
            os.close(fd)
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise
    return opened


def _name_unnamed(fd: int, path: Path) -> None:
    """Give the unnamed file `fd` the name `path` (linkat through /proc, following it)."""
    fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_CLOEXEC)
    try:  # a dir fd makes os.link call linkat(AT_SYMLINK_FOLLOW); plain link() would not
        os.link(str(fd), path, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def _swap_in(staging: Path, out: Path) -> None:
    """Put `staging` at `out` in one step; what was at `out` ends at `staging`."""
    if not out.exists():
        os.rename(staging, out)
    elif not _exchange(staging, out):  # two renames; `_recover` mends a cut between them
        import tempfile

        old = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(out)}old-", dir=out.parent))
        os.rmdir(old)
        os.rename(out, old)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(old, out)
            raise
        os.rename(old, staging)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
