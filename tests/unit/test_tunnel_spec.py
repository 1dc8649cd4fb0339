"""What a tunnel may ask for (``protocol_specs/wire/tunnels.py``), checked where it enters."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol_specs.wire.tunnels import TunnelSpec


def test_what_each_kind_needs_and_how_it_is_recorded() -> None:
    assert TunnelSpec(kind="exec", argv=["nvidia-smi", "-L"]).describe() == "exec: nvidia-smi -L"
    assert TunnelSpec(kind="shell").describe() == "shell"
    assert TunnelSpec(kind="forward", port=6006).describe() == "forward 6006"
    for bad in (
        {"kind": "exec"},  # no command
        {"kind": "forward"},  # no port
        {"kind": "forward", "port": 70000},
        {"kind": "shell", "cols": 0},
        {"kind": "exec", "argv": ["x" * (64 * 1024 + 1)]},
        {"kind": "ssh"},
    ):
        with pytest.raises(ValidationError):
            TunnelSpec.model_validate(bad)
