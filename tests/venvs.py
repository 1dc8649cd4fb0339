"""Venvs of their own for the heavy tiers (PyTorch, Ray): made at the repository's root on first
use, reused after; a venv that cannot be made skips its tests, or fails them where CI says they
must run (``TETHER_REQUIRE_<TIER>=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def own_venv(name: str, packages: list[str], probe: str, *, require: str) -> Path:
    """``ROOT/name``'s Python, with ``packages`` installed; ``probe`` (Python code) must run in it.
    ``require``: the variable that turns a skip into a failure."""
    python = ROOT / name / "bin" / "python"
    check = [str(python), "-c", probe]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(ROOT / name)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *packages],
            check=True,
            timeout=900,
            capture_output=True,
        )
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        said = getattr(exc, "stderr", b"") or b""
        reason = f"no {name} ({' '.join(packages)}): {said.decode(errors='replace')[-500:]}"
        if os.environ.get(require) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return python
