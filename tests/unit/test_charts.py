"""The web view's SVG charts: thinned, broken at NaN, escaped, and never empty markup."""

from __future__ import annotations

import math
import re

from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.web.charts import MOST, line_chart, thin
from protocol_specs.web.web import Match, Route, route


def test_a_long_series_is_thinned_keeping_its_last_point() -> None:
    points = [(i, float(i)) for i in range(10_001)]
    kept = thin(points)
    assert len(kept) <= MOST + 1 and kept[0] == (0, 0.0) and kept[-1] == (10_000, 10_000.0)
    assert thin(points[:10]) == points[:10]


def test_nan_breaks_the_line_and_a_lone_point_is_a_dot() -> None:
    points = [(0, 1.0), (1, 0.5), (2, math.nan), (3, 0.4), (4, math.inf), (5, 0.3), (6, 0.2)]
    svg = line_chart("loss", {"loss": points})
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 1
    assert "nan" not in svg.lower().replace("no points", "")


def test_names_and_titles_are_escaped_and_an_empty_chart_says_so() -> None:
    svg = line_chart('<script>"x"</script>', {"<b>": [(0, 1.0), (1, 2.0)]})
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;b&gt;" in svg
    assert "no points yet" in line_chart("loss", {"loss": [(0, math.nan)]})


@given(
    st.lists(
        st.tuples(st.integers(0, 10**9), st.floats(allow_nan=True, allow_infinity=True)),
        max_size=50,
    )
)
def test_any_series_draws_well_formed_coordinates(points: list[tuple[int, float]]) -> None:
    svg = line_chart("x", {"x": sorted(points, key=lambda p: p[0])})
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "nan" not in svg.replace("no points yet", "") and "inf" not in svg
    for x, y in re.findall(r"(-?[\d.]+),(-?[\d.]+)", svg):
        assert math.isfinite(float(x)) and math.isfinite(float(y))


def test_a_sweep_has_a_page_route() -> None:
    assert route("GET", "/ui/sweeps/s6b08abcd") == Match(Route.SWEEP, run="s6b08abcd")
    assert route("POST", "/ui/sweeps/s6b08abcd") == 405
    assert route("GET", "/ui/sweeps/x") == 404
