"""The values of one expression across ranks, merged and summarized (``tether eval``, ``@all``):
protocol_specs/session/rank_values.py, and the helper that describes a value in the rank
(worker_shim/inject/_tether_values.py), without a debugger."""

from __future__ import annotations

import json
import math

import pytest

from protocol_specs.session.rank_values import (
    EvalReport,
    RankValue,
    error_value,
    from_helper,
    nothing_evaluated,
    parse_prefix,
    render,
)
from worker_shim.inject import _tether_values


def helper(rank: int, value: object) -> RankValue:
    """``value`` as the rank's helper describes it, as debugpy's evaluate quotes it."""
    text = _tether_values.describe("v", {}, {"v": value})
    return from_helper(rank, repr(text))


def tensor_json(rank: int, **fields: object) -> RankValue:
    """A tensor as the helper in a rank with torch describes it."""
    data = {"type": "torch.Tensor", "shape": [3, 4], "dtype": "float32", "device": "cuda:0",
            "norm": 2.5, "nan": 0, "inf": 0, **fields}  # fmt: skip
    return from_helper(rank, repr(json.dumps(data)))


def test_equal_numbers_are_merged_and_summarized_with_the_rank_that_differs() -> None:
    values = [helper(r, 0.5) for r in (0, 1, 2, 4)] + [helper(3, 0.25)]
    assert render(values) == [
        "ranks 0-2,4: 0.5",
        "rank 3: 0.25",
        "summary: numbers: min 0.25 (rank 3), max 0.5 (ranks 0-2,4), mean 0.45 of 5",
        "  rank 3 differs from the majority (ranks 0-2,4: 0.5)",
    ]


def test_nan_is_named_and_left_out_of_min_max_mean_and_by_value_groups_it() -> None:
    values = [helper(0, 1.0), helper(1, 3.0), helper(3, float("nan")), helper(5, float("nan"))]
    lines = render(values)
    assert lines[:3] == ["rank 0: 1.0", "rank 1: 3.0", "ranks 3,5: nan"]
    assert (
        lines[3]
        == "summary: numbers: min 1 (rank 0), max 3 (rank 1), mean 2 of 2; NaN in ranks 3,5"
    )
    assert lines[4] == "  ranks 0-1 differ from the majority (ranks 3,5: nan)"
    # --by-value: numbers ascending, then NaN, each set with its count
    assert render(values, by_value=True)[:3] == [
        "rank 0 (1): 1.0",
        "rank 1 (1): 3.0",
        "ranks 3,5 (2): nan",
    ]


def test_tensors_show_shape_dtype_norm_and_nan_counts_never_data() -> None:
    values = [tensor_json(0), tensor_json(1), tensor_json(2, nan=5, norm=1.5)]
    lines = render(values)
    assert lines[0] == "ranks 0-1: tensor[3, 4] float32 on cuda:0 norm 2.5 nan 0 inf 0"
    assert lines[1] == "rank 2: tensor[3, 4] float32 on cuda:0 norm 1.5 nan 5 inf 0"
    assert lines[2] == (
        "summary: 3 tensors/arrays, shape [3, 4] float32; norm min 1.5 (rank 2), max 2.5 "
        "(ranks 0-1), mean 2.16667 of 3; NaN elements in rank 2 (rank 2: 5)"
    )
    assert (
        lines[3]
        == "  rank 2 differs from the majority (ranks 0-1: tensor[3, 4] float32 on cuda:0 norm 2.5 nan 0 inf 0)"
    )


def test_errors_one_line_each_and_ranks_not_paused_listed_not_evaluated() -> None:
    values = [
        helper(0, 7),
        from_helper(1, repr(_tether_values.describe("loss", {}, {}))),
        RankValue(rank=2, state="running"),
        helper(3, 7),
    ]
    assert values[1].error == "NameError: name 'loss' is not defined"
    assert render(values) == [
        "ranks 0,3: 7",
        "rank 1: NameError: name 'loss' is not defined",
        "rank 2: running (not evaluated)",
        "summary: numbers: min 7 (ranks 0,3), max 7 (ranks 0,3), mean 7 of 2",
        "  errors: rank 1",
        "  not paused, not evaluated: rank 2",
        "  all 2 evaluated ranks agree",
    ]


def test_mixed_values_strings_and_a_long_repr_is_cut_to_one_line() -> None:
    values = [helper(0, "a\nb"), helper(1, list(range(1000))), helper(2, None)]
    assert values[0].repr == "'a\\nb'" and values[0].number is None
    assert len(values[1].repr) == 160 and values[1].repr.endswith("...")
    assert render(values)[2] == "rank 2: None"
    assert render(values)[3] == "summary: all 3 evaluated ranks differ"


def test_a_result_that_is_not_the_helpers_is_a_plain_repr() -> None:
    value = from_helper(4, "tensor([1., 2.])")
    assert (value.rank, value.state, value.repr, value.type) == (4, "value", "tensor([1., 2.])", "")


def test_json_keeps_nan_and_reads_back() -> None:
    report = EvalReport(run="r1", expression="x", values=[helper(0, float("nan")), helper(1, 2)])
    text = report.model_dump_json()
    assert '"number":"NaN"' in text
    back = EvalReport.model_validate_json(text)
    assert back.values[0].number is not None and math.isnan(back.values[0].number)
    assert back.values[1].number == 2.0


@pytest.mark.parametrize(
    ("text", "ranks", "expression", "error"),
    [
        ("@all loss.item()", None, "loss.item()", ""),
        ("  @ranks 0-2,5 grad.norm()", [0, 1, 2, 5], "grad.norm()", ""),
        ("@rank 3 x + 1", [3], "x + 1", ""),
        ("@rank 1-2 x", None, "", "@rank takes one rank, not 1-2 (@ranks does)"),
        (
            "@ranks a x",
            None,
            "",
            "@ranks: 'a': give ranks like 0,3 or 0-3 (e.g. @ranks 0-3 loss.item())",
        ),
        ("@all", None, "", "@all: no expression (e.g. @all loss.item())"),
    ],
)
def test_the_console_prefix(
    text: str, ranks: list[int] | None, expression: str, error: str
) -> None:
    prefix = parse_prefix(text)
    assert prefix is not None
    assert (prefix.ranks, prefix.expression, prefix.error) == (ranks, expression, error)


@pytest.mark.parametrize("text", ["loss", "@allx", "x @all y", "@ranksy 1 x"])
def test_ordinary_expressions_have_no_prefix(text: str) -> None:
    assert parse_prefix(text) is None


def test_why_nothing_was_evaluated() -> None:
    running = [RankValue(rank=r, state="running") for r in range(4)]
    assert (
        nothing_evaluated(running) == "no rank is paused (ranks 0-3 running): pause the run first"
    )
    assert nothing_evaluated([RankValue(rank=9, state="absent")]) == (
        "rank 9: no such rank is being debugged"
    )
    assert nothing_evaluated([]).startswith("no ranks are being debugged")
    assert nothing_evaluated([*running, RankValue(rank=5, state="error", error="E")]) == ""


def test_by_value_puts_tensors_with_nan_elements_after_the_clean_ones() -> None:
    values = [tensor_json(0, nan=2, norm=0.5), tensor_json(1, norm=9.0), tensor_json(2, norm=9.0)]
    assert render(values, by_value=True)[:2] == [
        "ranks 1-2 (2): tensor[3, 4] float32 on cuda:0 norm 9 nan 0 inf 0",
        "rank 0 (1): tensor[3, 4] float32 on cuda:0 norm 0.5 nan 2 inf 0",
    ]


def test_debugpys_traceback_is_one_line_its_exception() -> None:
    said = (
        'Traceback (most recent call last):\n  File "pydevd_vars.py", line 586, in e\n'
        '    compiled = _compile_as_exec(expression)\n  File "<string>", line 1\n'
        "    @all x\n         ^^^\nSyntaxError: invalid syntax\n "
    )
    assert error_value(2, said).error == "SyntaxError: invalid syntax"
    assert error_value(2, "Unable to find thread\nfor evaluation").error == (
        "Unable to find thread for evaluation"
    )


def test_an_array_is_summarized_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN and Inf counted, and the norm of the finite elements, across chunks: a summary never
    copies the whole array (a paused rank's memory may be nearly full)."""
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(_tether_values, "CHUNK", 7)
    a = np.arange(60, dtype=np.float32).reshape(6, 10) / 10
    a[0, 3] = a[5, 9] = np.nan
    a[2, 2] = np.inf
    a[4, 0] = -np.inf
    out = json.loads(_tether_values.describe("a", {}, {"a": a}))
    finite = a[np.isfinite(a)].astype(np.float64)
    assert (out["nan"], out["inf"], out["shape"], out["dtype"]) == (2, 2, [6, 10], "float32")
    assert out["norm"] == pytest.approx(float(np.linalg.norm(finite)))
    whole = json.loads(_tether_values.describe("b", {}, {"b": np.arange(5) * 1j}))
    assert (whole["nan"], whole["inf"]) == (0, 0)
    assert whole["norm"] == pytest.approx(float(np.linalg.norm(np.arange(5))))


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.T,
        lambda a: a[:, ::3],
        lambda a: a[1:5, 2:],
        lambda a: a.transpose(2, 0, 1),
        lambda a: a[:, :, 1],
        lambda a: a[0, 0, ::2],
    ],
    ids=["transposed", "strided", "sliced", "permuted", "a-column", "1-d strided"],
)
def test_a_non_contiguous_array_is_cut_in_views_never_copied(view: object) -> None:
    """The chunking torch's tensors share (contiguous: runs of the flat view; else slices along
    the first dimension, recursing): every piece a view of at most CHUNK elements, every
    element in exactly one piece."""
    np = pytest.importorskip("numpy")
    base = np.arange(6 * 7 * 10, dtype=np.float64).reshape(6, 7, 10)
    a = view(base)  # type: ignore[operator]
    pieces = list(_tether_values._pieces(a, 7, _tether_values._numpy_flat))
    assert all(p.size <= 7 and np.shares_memory(p, base) for p in pieces)
    seen = np.sort(np.concatenate([p.reshape(-1) for p in pieces]))
    assert np.array_equal(seen, np.sort(a.reshape(-1)))


def test_a_summary_of_a_transposed_or_expanded_array_takes_a_chunk_not_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paused rank's memory may be nearly full: ``w.T`` (8 MB here) is never flattened whole;
    NaN is counted in a copy of a piece, the user's array left as it was."""
    np = pytest.importorskip("numpy")
    import tracemalloc

    monkeypatch.setattr(_tether_values, "CHUNK", 1000)
    a = np.ones((1000, 2000), dtype=np.float32)
    a[1, 1] = np.nan
    for x, nan in ((a.T, 1), (np.broadcast_to(np.arange(2000.0), (1000, 2000)), 0)):
        tracemalloc.start()
        try:
            out = json.loads(_tether_values.describe("x", {}, {"x": x}))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 200_000
        assert out["nan"] == nan
        finite = np.nan_to_num(x.astype(np.float64), nan=0.0)
        assert out["norm"] == pytest.approx(float(np.linalg.norm(finite)))
    assert np.isnan(a[1, 1])


def test_a_big_containers_repr_is_bounded_as_it_is_written() -> None:
    """``@all dataset.indices``: not the whole list's text (tens of MB in every rank)."""
    import tracemalloc

    indices = list(range(1_000_000))
    tracemalloc.start()
    try:
        value = helper(0, indices)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert value.repr.startswith("[0, 1, 2, 3,") and len(value.repr) == 160
    many = {n: [n] * 3 for n in range(200_000)}
    assert helper(1, many).repr.startswith("{0: [0, 0, 0], 1: [1, 1, 1],")
    assert helper(2, {3, 1}).repr in ("{1, 3}", "{3, 1}")
    assert helper(3, [[1, 2], (3,), {"a": {}}, frozenset()]).repr == (
        "[[1, 2], (3,), {'a': {}}, frozenset()]"
    )
    assert helper(4, "x" * 10).repr == repr("x" * 10)


class DTensor:
    """A distributed tensor as torch's: anything global about it is a collective."""

    __module__ = "torch.distributed.tensor"

    def __init__(self, local: object) -> None:
        self.local = local

    def to_local(self) -> object:
        return self.local

    def sum(self) -> object:
        raise AssertionError("a collective in one rank: it would hang")


def test_a_dtensor_is_described_by_its_local_shard() -> None:
    np = pytest.importorskip("numpy")
    value = helper(2, DTensor(np.full((2, 3), 2.0, dtype=np.float32)))
    assert (value.local, value.shape, value.norm, value.type) == (
        True,
        [2, 3],
        pytest.approx(math.sqrt(24)),
        "torch.distributed.tensor.DTensor",
    )
    assert value.text() == "tensor[2, 3] (local shard) float32 norm 4.89898 nan 0 inf 0"
    assert not helper(3, np.zeros(2)).local


def test_a_rank_list_names_at_most_max_ranks_in_all_as_the_specs_take() -> None:
    """``@ranks 0-4095,4096-8191,...`` made the worker build millions of values; the list is
    refused as it is read, with one line, and a list it accepts is one a spec takes too."""
    from protocol_specs.session.focus import MAX_FOCUS
    from protocol_specs.session.rank_values import MAX_RANKS, parse_rank_list
    from protocol_specs.wire.tunnels import TunnelSpec

    assert MAX_RANKS == MAX_FOCUS
    most = parse_rank_list(f"0-{MAX_RANKS - 1}")
    assert len(TunnelSpec(kind="eval", expression="x", ranks=most).ranks) == MAX_RANKS
    huge = ",".join(f"{n}-{n + 4095}" for n in range(0, 4096 * 1000, 4096))
    prefix = parse_prefix(f"@ranks {huge} loss")
    assert prefix is not None and prefix.ranks is None
    assert prefix.error == "@ranks: 4096 ranks at most in all (e.g. @ranks 0-3 loss.item())"
    with pytest.raises(ValueError, match="4096 ranks at most in all"):
        parse_rank_list(f"0-{MAX_RANKS - 1},{MAX_RANKS}")
