"""``./dev bench --only NAME --merge``: the sections measured again replace theirs in the saved
figures, the others stay, and the report says which were measured when."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.__main__ import _merged
from bench.common import Dist


def saved(path: Path, figures: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, default=vars))
    return path


def test_the_sections_measured_again_replace_theirs_and_the_rest_stay(tmp_path: Path) -> None:
    old = {
        "quick": False,
        "date": "yesterday",
        "snapshot": {"ms": Dist([1.0, 2.0])},
        "idle": {"p99": 1},
        "errors": {"snapshot": "it failed", "flood": "so did this"},
    }
    path = saved(tmp_path / "results" / "figures.json", old)
    new = {"quick": False, "date": "today", "snapshot": {"ms": Dist([3.0])}}
    merged = _merged(path, new, {"snapshot"})
    assert merged["snapshot"]["ms"].samples == [3.0] and merged["idle"] == {"p99": 1}
    assert merged["date"] == "yesterday"  # the run the rest is from
    assert merged["remeasured"] == [{"date": "today", "only": ["snapshot"]}]
    assert merged["errors"] == {"flood": "so did this"}  # the section measured again is whole
    # figures read back are distributions again, for the report's other sections
    again = _merged(saved(path, merged), {"quick": False, "date": "later"}, {"idle"})
    assert isinstance(again["snapshot"]["ms"], Dist) and len(again["remeasured"]) == 2


def test_nothing_to_merge_with_is_a_new_report(tmp_path: Path) -> None:
    new = {"quick": True, "date": "today"}
    assert _merged(tmp_path / "absent.json", new, {"idle"}) is new
    path = saved(tmp_path / "figures.json", {"quick": False, "date": "full sizes"})
    assert _merged(path, new, {"idle"}) is new  # a quick run never mixes with a full one


def test_merge_with_no_saved_figures_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # the report is committed and its figures are not: merging into nothing would drop every
    # other section of a fresh clone's report, after the benchmarks ran
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "latency", "--merge", "--out", str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "--merge: there are no figures to merge into" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "results").exists()
