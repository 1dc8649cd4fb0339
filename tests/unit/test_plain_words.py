"""Refusals of bad settings in tether's words: the setting by the name the user gave it, the value,
what it must be (``protocol_specs/plain_words.py``); never pydantic's "Input should be ..."."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, ValidationError

from adapter.cli.parser import build_parser
from adapter.cli.submission import build_spec
from adapter.config import ConfigError, load_profile
from protocol_specs.plain_words import invalid


class _Model(BaseModel):
    count: int = Field(default=0, ge=0, le=64)
    rate: float = 0.0
    mode: str = Field(default="a", max_length=3)
    tags: list[str] = Field(default_factory=list, max_length=2)


def _said(**given: object) -> str:
    with pytest.raises(ValidationError) as caught:
        _Model.model_validate(given)
    return invalid(caught.value, {"count": "--count", "tags": "--tag"})


def test_a_value_out_of_bounds_names_the_setting_the_value_and_the_bound() -> None:
    assert _said(count=100) == "--count 100: must be at most 64"
    assert _said(count=-1) == "--count -1: must be at least 0"
    assert _said(count="two") == "--count 'two': must be a whole number"
    assert _said(count=1.5) == "--count 1.5: must be a whole number"
    assert _said(rate="fast") == "rate 'fast': must be a number"
    assert _said(mode="long") == "mode 'long': must be at most 3 characters long"
    assert _said(tags=["a", "b", "c"]) == "--tag: must be at most 2 items"


def _args(tmp_path: Path, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(
        ["run", "--workdir", str(tmp_path), *flags, "--", "python", "t.py"]
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--gpus", "100"], "tether: --gpus 100: must be at most 64"),
        (["--max-retries", "1000"], "tether: --max-retries 1000: must be at most 100"),
        (["--time", "400d"], "tether: --time (seconds) 34560000: must be at most 31536000"),
        (["--name", "x" * 201], "tether: --name 'xxxx"),
    ],
)
def test_run_flags_are_refused_by_their_names(
    tmp_path: Path, flags: list[str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    with pytest.raises(SystemExit) as refused:
        build_spec(_args(tmp_path, *flags), debug=False)
    text = str(refused.value)
    assert text.startswith(said) and "Input should" not in text and "\n" not in text


def test_a_config_value_of_the_wrong_kind_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[default]\ngpus = "two"\n')
    with pytest.raises(ConfigError) as refused:
        load_profile("default", path)
    assert str(refused.value) == f"{path}: profile 'default': gpus 'two': must be a whole number"


def test_a_sweep_setting_names_its_flag_and_file_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapter.cli.sweeps import sweep_spec

    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "t.py").write_text("")
    args = build_parser().parse_args(
        ["sweep", "--workdir", str(tmp_path), "--param", "lr=[1,2]", "--parallel", "0", "--",
         "python", "t.py", "{lr}"]
    )  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        sweep_spec(args)
    assert (
        str(refused.value) == "tether: invalid sweep: --parallel (parallel) 0: must be at least 1"
    )
