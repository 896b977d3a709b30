"""One answer whatever the mapper (issue #47): every multi-rank trace set in `traces/` and
`../shared/traces` (found, not chosen: each folder whose files split into two or more
PyTorch ranks) gives the same output, byte for byte, for every command that reads ranks
one per task, whether they run in this process (-j 1), on a local pool (-j 2) or on a Dask
cluster; a set a command refuses is refused with the same line and exit status."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, SHARED, run_cli

COMMANDS = {
    "metrics": ["metrics", "--json"],
    "schedule": ["schedule", "-a", "caramel", "--json"],
    "simulate": ["simulate", "--samples", "5", "--json"],
    "analyze": ["analyze", "--json"],
}


def multi_rank_sets() -> dict[str, Path]:
    """Label -> folder of every set of two or more PyTorch rank files (`rank_inputs`)."""
    from planner.job import parallel

    found = {}
    for root in (REPO / "traces", SHARED):
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.rglob("*") if p.is_dir()):
            if "_history" in folder.parts:
                continue
            ranks = parallel.rank_inputs([folder])
            if ranks is not None and len(ranks) > 1:
                found[str(folder.relative_to(root.parent))] = folder
    return found


SETS = multi_rank_sets()


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    """One LocalCluster of two worker processes for the whole module."""
    distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")
    with distributed.LocalCluster(
        host="127.0.0.1", n_workers=2, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address


def _outputs(
    command: str, folder: Path, mode: list[str], target: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str, dict[str, bytes]]:
    """(exit status, stdout, the error line, the files written to `target`) of one run."""
    argv = [COMMANDS[command][0], folder, *COMMANDS[command][1:], *mode]
    if command == "analyze":
        argv += ["-o", target]
    code, out, err = run_cli(argv, capsys)
    files = {p.name: p.read_bytes() for p in sorted(target.iterdir())} if target.is_dir() else {}
    shutil.rmtree(target, ignore_errors=True)  # the next mode writes the same folder
    return code, out, err.strip().splitlines()[-1] if code else "", files


def test_the_sets_are_found() -> None:
    """The repo's own runs are multi-rank sets whatever is beside the checkout."""
    assert {"traces/torch/resnet_ddp", "traces/torch/ddp_mlp24_gloo/cap4"} <= set(SETS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("label", sorted(SETS))
def test_one_answer_whatever_the_mapper(
    label: str,
    command: str,
    dask_address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = SETS[label]
    modes = {"-j 1": ["-j", "1"], "-j 2": ["-j", "2"], "dask": ["--dask", dask_address]}
    got = {
        name: _outputs(command, folder, mode, tmp_path / "out", capsys)
        for name, mode in modes.items()
    }
    first = got["-j 1"]
    assert first[0] in (0, 2), first[2]
    for name, result in got.items():
        assert result[:3] == first[:3], f"{label} {command}: {name} differs from -j 1"
        assert result[3] == first[3], f"{label} {command}: {name} wrote other files"
