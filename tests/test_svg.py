"""The report's chart writer (`planner.reporting.svg`): round ticks inside the axis, labels
that read as the values, text escaped, and a layout record that is the drawn layout."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from planner.reporting import plots
from planner.reporting.svg import Plot, layout_of, nice_ticks, rect, tick_labels

spans = st.tuples(st.floats(0, 1e6), st.floats(1e-3, 1e6))


@given(spans, st.integers(2, 10), st.booleans())
def test_ticks_are_round_inside_the_axis_and_few(span, most, integer) -> None:  # noqa: ANN001
    low, width = span
    high = low + width
    ticks = nice_ticks(low, high, most, integer)
    assert 1 <= len(ticks) <= max(most, 2)
    slack = 1e-8 * width  # float error, in the axis' own units
    assert all(low - slack <= t <= high + slack for t in ticks)
    if len(ticks) > 1:
        step = ticks[1] - ticks[0]
        # a tick is a double: far from 0 two of them differ by whole ulps of their size
        ulps = 4 * math.ulp(max(abs(low), abs(high)))
        assert all(
            math.isclose(b - a, step, rel_tol=1e-6, abs_tol=ulps)
            for a, b in zip(ticks, ticks[1:], strict=False)
        )
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10))
        if integer:
            assert all(float(t).is_integer() for t in ticks)


@given(spans)
def test_tick_labels_read_back_as_the_ticks(span) -> None:  # noqa: ANN001
    low, width = span
    ticks = nice_ticks(low, low + width)
    labels = tick_labels(ticks)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    for value, label in zip(ticks, labels, strict=True):
        assert abs(float(label) - value) < step / 100


def test_text_is_escaped_and_the_svg_parses() -> None:
    plot = Plot("bar", 200, 100, xticks=[(0, "a<b & c>d")], ylabel="ms", xlabel="x & y")
    rect(plot, -0.3, 0.3, 0, 0.5, "#4c78a8")
    svg = plot.svg()
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a<b & c>d" in texts and "x & y" in texts
    record = layout_of(svg)
    assert record["kind"] == "bar" and record["ylim"] == [0.0, 1.0]
    left, top, right, bottom = record["boxes"]["axes"]
    assert math.isclose(right - left, 200) and math.isclose(bottom - top, 100)


def test_a_bucket_sweep_draws_every_cap_on_its_log_axis() -> None:
    caps = [{"bucket_cap_mb": c, "predicted_step_time": 1.2 + c / 1e3} for c in (0.25, 1, 25, 100)]
    record = layout_of(
        plots.bucket_sweep(caps, 1.25, {"bucket_cap_mb": 25, "predicted_step_time": 1.3})
    )
    assert record["xscale"] == "log" and record["ylim"][0] == 0
    low, high = record["xlim"]
    assert low < 0.25 and high > 100
