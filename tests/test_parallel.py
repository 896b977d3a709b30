"""Per-rank parallel analysis: same figures as one process, on a pool and on Dask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEMO, REPO, SHARED, need, run_cli
from test_schemas import validate

from planner import analysis
from planner.errors import InputError
from planner.ingest import detect
from planner.parallel import analyze_ranks

MLP = SHARED / "generated" / "tf" / "mlp_ps_betweengraph_sync"
RESNET = REPO / "traces" / "torch" / "resnet_ddp"


def _ranks(kind: str) -> list[list[Path]]:
    if kind == "tf":
        return [[need(MLP / "worker0")], [MLP / "worker1"]]
    return [[need(RESNET / "rank0.json.gz")], [RESNET / "rank1.json.gz"]]


@pytest.mark.parametrize("kind", ["tf", "torch"])
def test_pool_matches_one_process_and_the_joint_load(kind: str) -> None:
    inputs = _ranks(kind)
    pooled, usage = analyze_ranks(inputs, workers=2)
    serial, _ = analyze_ranks(inputs, workers=1)
    assert pooled == serial
    joint = detect.load([p for paths in inputs for p in paths])
    whole = analysis.metrics(joint)
    key = lambda s: (s["rank"], s["iteration"])  # noqa: E731
    assert sorted(pooled["steps"], key=key) == sorted(whole["steps"], key=key)
    # one straggler definition: the longest wait in collectives for a later rank
    stragglers = {s["iteration"]: s for s in (whole["allreduce"] or {}).get("stragglers", [])}
    for item in pooled["iterations"]:
        expected = stragglers.get(item["iteration"], {}).get("straggler_time", 0.0)
        assert item["straggler"] == pytest.approx(expected, abs=1e-9)
    assert pooled["job"]["ranks"] == 2 and pooled["job"]["common_iterations"] == 5
    assert len(usage) == 2 and all(u["peak_rss_mib"] > 10 for u in usage)


def test_a_bad_rank_is_an_input_error(tmp_path: Path) -> None:
    broken = tmp_path / "rank1.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError) as caught:
        analyze_ranks([[DEMO], [broken]], workers=2)
    assert caught.value.path == str(broken)


def test_the_same_rank_twice_is_refused() -> None:
    with pytest.raises(InputError, match="rank 'worker0' also comes from"):
        analyze_ranks([[DEMO], [DEMO]], workers=1)


def test_cli_analyze_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ranks.json"
    code, _, err = run_cli(["analyze-ranks", DEMO, "-j", "1", "-o", out], capsys)
    assert code == 0, err
    document = json.loads(out.read_text())
    validate(document)
    assert document["schema"] == "planner.ranks/1" and document["job"]["ranks"] == 1
    code, stdout, err = run_cli(["analyze-ranks", DEMO, tmp_path / "none", "-o", out], capsys)
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and "none" in err


def test_on_a_dask_local_cluster() -> None:
    distributed = pytest.importorskip("distributed")
    inputs = _ranks("tf")
    expected, _ = analyze_ranks(inputs, workers=1)
    with distributed.LocalCluster(
        host="127.0.0.1", n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        got, usage = analyze_ranks(inputs, dask_address=cluster.scheduler_address)
    assert got == expected
    assert len({u["pid"] for u in usage}) >= 1


def test_unreachable_dask_scheduler_is_an_input_error() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        analyze_ranks([[DEMO]], dask_address="tcp://127.0.0.1:9")
