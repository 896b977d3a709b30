"""A client GraphDef's TIC plan covers the training step only (the fetches' ancestry), so
its recvs are those the RunMetadata of a traced step records; and the docs' counts are
those `inspect` prints."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import planner
from tests.conftest import DEMO, REPO, TF, need

MLP = REPO / "traces" / "tf" / "mlp_ps_betweengraph_sync"
PAIRS = {
    "worker0": (MLP / "worker0" / "graph.pb", DEMO),
    "worker1": (MLP / "worker1" / "graph.pb", MLP / "worker1"),
}


@pytest.mark.parametrize("rank", sorted(PAIRS))
def test_tic_plan_of_the_graphdef_has_the_recvs_of_the_step(rank: str) -> None:
    graph, traced = PAIRS[rank]
    planned = planner.schedule(planner.load(graph), "tic").to_frame()
    recvs = set(planner.load(traced).graphs[rank].recvs)
    assert len(recvs) == 14  # 12 variables, the global step, SyncReplicas' token
    assert set(planned["name"]) == recvs
    assert not any("IsInitialized" in name for name in planned["name"])


def test_the_step_leaves_out_initializers_and_the_saver() -> None:
    job = planner.load(PAIRS["worker0"][0])
    names = set(job.graphs["worker0"].ops)
    assert not {n for n in names if "IsInitialized" in n or n.startswith(("save/", "init"))}
    assert {"MatMul", "gradients/MatMul_grad/MatMul_1", "recv:sync_token_q_Dequeue"} <= names
    assert any("training step: the ancestry of" in note for note in job.notes)


def test_in_graph_cnn_has_no_recv_the_step_does_not_make() -> None:
    folder = need(TF / "cnn_ps_ingraph")
    planned = planner.schedule(planner.load(folder / "graph.pb"), "tic").to_frame()
    traced = planner.load(folder)
    for rank, names in planned.groupby("rank")["name"]:
        recvs = set(traced.graphs[rank].recvs)
        assert set(names) <= recvs, sorted(set(names) - recvs)
        data = {r for r in recvs if "^" not in r and r != "recv:truediv"}  # loss fetch
        assert data <= set(names)


def test_getting_started_counts_are_what_inspect_prints() -> None:
    text = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    found = re.search(r"its (\d+) transfers.*?(\d+) receives.*?(\d+) sends", text, re.S)
    assert found, "getting-started.md no longer states the demo's transfer counts"
    total, receives, sends = map(int, found.groups())
    kinds = Counter(planner.inspect(planner.load(DEMO)).to_frame()["kind"])
    assert (total, receives, sends) == (sum(kinds.values()), kinds["recv"], kinds["send"])
