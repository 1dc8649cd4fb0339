"""A run's outputs without I/O: the globs (``protocol_specs/checkpoints/outputs.py``), their
validation in the spec and at submit, ``tether cp``'s plan and parsing, the web view's route and
section."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from adapter.cli.outputs import copy_plan, outputs_table, split_source
from adapter.cli.submission import build_spec
from protocol_specs.checkpoints.files import CHUNK, FileSet, StoredFile
from protocol_specs.checkpoints.outputs import check_patterns, matcher
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.web import web
from relay.web.outputs import outputs_section

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    ("patterns", "path", "selected"),
    [
        (["preds.csv"], "preds.csv", True),
        (["*.csv"], "preds.csv", True),
        (["*.csv"], "sub/preds.csv", False),  # * stays within a name
        (["**/*.csv"], "sub/deep/preds.csv", True),
        (["**/*.csv"], "preds.csv", True),  # ** is any depth, none included
        (["out/"], "out/a.bin", True),
        (["out"], "out/sub/b.bin", True),  # a directory's name: everything under it
        (["out"], "outside.bin", False),
        (["out/*.bin"], "out/a.bin", True),
        (["out/*.bin"], "out/sub/a.bin", False),
        (["out/**/*.bin"], "out/sub/a.bin", True),
        (["out/**"], "out/sub/a.bin", True),
        (["out/**"], "out", False),
        (["./out//a.bin"], "out/a.bin", True),
        (["a?.txt"], "ab.txt", True),
        (["[ab].txt"], "c.txt", False),
        (["**"], "anything/at/all", True),
        ([], "preds.csv", False),
        (["*.csv", "out/"], "train.py", False),
    ],
)
def test_globs_select_paths(patterns: list[str], path: str, selected: bool) -> None:
    assert matcher(patterns)(path) is selected


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("/etc/passwd", "is absolute"),
        ("C:/data", "is absolute"),
        ("../secrets", "leaves the run's directory"),
        ("out/../../x", "leaves the run's directory"),
        ("out\\a.bin", "write paths with /"),
        ("", "is empty"),
        ("  ", "is empty"),
        ("a**b", "stands alone between slashes"),
        ("x\n", "control character"),
        ("a" * 501, "longer than 500"),
    ],
)
def test_bad_globs_are_refused_in_one_line(pattern: str, said: str) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        check_patterns([pattern])
    assert "\n" not in str(caught.value)


def test_at_most_64_globs() -> None:
    assert check_patterns(["*.csv"] * 64) == ["*.csv"] * 64
    with pytest.raises(ValueError, match="at most 64"):
        check_patterns(["*.csv"] * 65)


@given(st.lists(st.sampled_from(["a", "b", "**", "*", "c?"]), min_size=1, max_size=12))
def test_many_double_stars_stay_cheap(names: list[str]) -> None:
    # memoised on the tails: a path of 40 names against any mix ends at once
    matcher(["/".join(names)])("/".join(["a"] * 40))


def test_the_spec_refuses_bad_outputs() -> None:
    spec = RunSpec(command=["python", "t.py"], workdir="/w", outputs=["out/", "*.csv"])
    assert spec.outputs == ["out/", "*.csv"]
    with pytest.raises(ValidationError, match="leaves the run's directory"):
        RunSpec(command=["python", "t.py"], workdir="/w", outputs=["../x"])


def _args(tmp_path: Path, *words: str, cmd: str = "run") -> argparse.Namespace:
    from adapter.cli.parser import build_parser

    return build_parser().parse_args([cmd, "--workdir", str(tmp_path), *words])


@pytest.mark.parametrize("cmd", ["run", "debug", "sweep"])
def test_outputs_flag_on_each_submitting_command(tmp_path: Path, cmd: str) -> None:
    args = _args(tmp_path, "--outputs", "out/", "*.csv", "--outputs", "x.png", "--", "python",
                 "t.py", cmd=cmd)  # fmt: skip
    assert args.outputs == ["out/", "*.csv", "x.png"]
    assert args.command[-2:] == ["python", "t.py"]


def test_bad_outputs_are_refused_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    args = _args(tmp_path, "--outputs", "/abs", "--", "python", "t.py")
    with pytest.raises(SystemExit, match=r"^tether: --outputs: .*is absolute") as caught:
        build_spec(args, debug=False)
    assert "\n" not in str(caught.value)


def test_the_config_key_names_outputs_and_the_flag_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[default]\noutputs = ["out/", "*.csv"]\n')
    monkeypatch.setenv("TETHER_CONFIG", str(config))
    spec = build_spec(_args(tmp_path, "--", "python", "t.py"), debug=False)
    assert spec.outputs == ["out/", "*.csv"]
    given_flag = _args(tmp_path, "--outputs", "model.pt", "--", "python", "t.py")
    assert build_spec(given_flag, debug=False).outputs == ["model.pt"]


def _files(*paths: str) -> FileSet:
    return FileSet(
        files=[
            StoredFile(path=p, size=CHUNK + 1, mode=0o600, attempt=2, mtime=1.0e9,
                       chunks=[DIGEST, DIGEST])
            for p in sorted(paths)
        ]
    )  # fmt: skip


OUTS = _files("out/a.bin", "out/sub/b.bin", "preds.csv")


@pytest.mark.parametrize(
    ("path", "local", "is_dir", "dest", "written"),
    [
        ("", "dl", True, "dl", ["out/a.bin", "out/sub/b.bin", "preds.csv"]),
        ("out", ".", True, ".", ["out/a.bin", "out/sub/b.bin"]),
        ("out/sub", "dl", True, "dl", ["sub/b.bin"]),
        ("out/a.bin", ".", True, ".", ["a.bin"]),
        ("out/a.bin", "x/model.bin", False, "x", ["model.bin"]),
        ("preds.csv", "p.csv", False, ".", ["p.csv"]),
    ],
)
def test_cp_writes_as_scp_r_does(
    path: str, local: str, is_dir: bool, dest: str, written: list[str]
) -> None:
    where, plan = copy_plan("r1", OUTS, path, Path(local), is_dir)
    assert (where, [f.path for f in plan]) == (Path(dest), written)
    assert all(f.mode == 0o600 and f.chunks == [DIGEST, DIGEST] for f in plan)


def test_cp_of_a_path_the_outputs_lack_names_what_they_have() -> None:
    with pytest.raises(ValueError, match=r"run r1's outputs have no model\.pt \(they have: "
                       r"out/a\.bin, out/sub/b\.bin, preds\.csv\)"):  # fmt: skip
        copy_plan("r1", OUTS, "model.pt", Path("."), True)
    with pytest.raises(ValueError, match="run r1 has no outputs"):
        copy_plan("r1", FileSet(), "", Path("."), True)
    with pytest.raises(ValueError, match="out/a"):  # a prefix of a name is not its directory
        copy_plan("r1", OUTS, "out/a", Path("."), True)


def test_cp_sources() -> None:
    assert split_source("r1:out/a.bin") == ("r1", "out/a.bin")
    assert split_source("r1:") == ("r1", "")
    assert split_source("r1:/out/") == ("r1", "out")
    with pytest.raises(SystemExit, match="give RUN:PATH"):
        split_source("r1")
    with pytest.raises(SystemExit, match="give RUN:PATH"):
        split_source(":out")


def test_the_listing_says_path_size_attempt() -> None:
    lines = outputs_table(OUTS).splitlines()
    assert lines[0].split() == ["PATH", "SIZE", "ATTEMPT", "MODIFIED"]
    assert lines[3].split()[:3] == ["preds.csv", str(CHUNK + 1), "2"]


@pytest.mark.parametrize(
    ("method", "path", "want"),
    [
        ("GET", "/ui/runs/r1/outputs/out/a%20b.bin",
         web.Match(web.Route.OUTPUT, run="r1", name="out/a b.bin")),
        ("HEAD", "/ui/runs/r1/outputs/preds.csv",
         web.Match(web.Route.OUTPUT, run="r1", name="preds.csv")),
        ("POST", "/ui/runs/r1/outputs/preds.csv", 405),
        ("GET", "/ui/runs/r1/outputs/", 404),
        ("GET", "/ui/runs/r1/outputs/a%00b", 404),
    ],
)  # fmt: skip
def test_output_route(method: str, path: str, want: web.Match | int) -> None:
    assert web.route(method, path) == want


def test_the_run_page_lists_outputs_with_a_link_each() -> None:
    record = RunRecord(id="r1", owner="u", spec=RunSpec(command=["p"], workdir="/w"),
                       snapshot="s", outputs=3)  # fmt: skip
    html = outputs_section(record, _files("out/<a>.bin", "preds.csv"))
    assert 'href="/ui/runs/r1/outputs/out/%3Ca%3E.bin" download>out/&lt;a&gt;.bin</a>' in html
    assert 'href="/ui/runs/r1/outputs/preds.csv"' in html
    assert outputs_section(record, None) == outputs_section(record, FileSet()) == ""
