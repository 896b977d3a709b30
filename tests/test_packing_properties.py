"""Caramel's 2D bin packing (§4.3) on random groups: no channel carries two transfers at
once, nothing leaves its window without reporting the overhead it costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.planning.packing import Group, pack

EPS = 1e-9


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Group], float, float, int]:
    backward = draw(st.floats(0.5, 10.0))
    forward = draw(st.floats(0.5, 10.0))
    groups = []
    for i in range(draw(st.integers(1, 12))):
        groups.append(
            Group(
                name=f"g{i}",
                nbytes=draw(st.integers(1, 1 << 24)),
                duration=draw(st.floats(0.01, 4.0)),
                ready=draw(st.floats(0.0, backward)),
                read=draw(st.floats(0.0, forward)),
            )
        )
    return groups, backward, forward, draw(st.integers(1, 3))


def absolute(place, backward: float, gap: float) -> tuple[float, float]:
    """Placement on one time axis: backward pass at 0, next forward pass at B + gap."""
    if place.pass_ in ("backward", "beyond_backward"):
        return place.start, place.end
    return backward + gap + place.start, backward + gap + place.end


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_packing_respects_channels_windows_and_reports_overheads(case):
    groups, backward, forward, channels = case
    packing = pack(groups, backward, forward, channels)
    by_name = {g.name: g for g in groups}
    assert sorted(p.group for p in packing.placements) == sorted(by_name)
    lanes: dict[int, list[tuple[float, float]]] = {}
    for place in packing.placements:
        group = by_name[place.group]
        assert 0 <= place.channel < channels
        assert place.end - place.start == pytest.approx(group.duration)
        assert place.overhead >= 0
        if place.pass_ in ("backward", "beyond_backward"):
            assert place.start >= group.ready - EPS  # never before the gradient exists
        else:
            assert place.end <= group.read + EPS  # always before its first read
        inside = (place.pass_ == "backward" and place.end <= backward + EPS) or (
            place.pass_ == "forward" and place.start >= -EPS
        )
        if not inside:
            assert place.pass_ in ("beyond_backward", "beyond_forward")
        if place.pass_ in ("backward", "forward"):
            assert inside
        lanes.setdefault(place.channel, []).append(absolute(place, backward, packing.gap))
    for intervals in lanes.values():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end - EPS, intervals
    assert packing.gap == pytest.approx(sum(p.overhead for p in packing.placements))
    assert packing.iteration_time == pytest.approx(backward + forward + packing.gap)
    assert packing.gap >= 0


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_groups_that_fit_cost_nothing(case):
    """With the network idle enough (durations scaled down), every group fits its window."""
    groups, backward, forward, channels = case
    tiny = [Group(g.name, g.nbytes, 1e-6, min(g.ready, backward * 0.5), g.read) for g in groups]
    packing = pack(tiny, backward, forward, channels)
    assert packing.gap == pytest.approx(0.0, abs=1e-9)
    assert all(p.pass_ in ("backward", "forward") for p in packing.placements)
