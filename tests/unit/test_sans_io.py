"""protocol_specs is sans-I/O: no event loop, socket or Redis module, directly or through imports.

The standard library's ``socket`` module itself is loaded transitively (pydantic's plugin lookup
reads package metadata, which imports ``email.utils``, which imports ``socket``), so for the stdlib
the check is on protocol_specs' own import statements; for trio, asyncio, websockets and the Redis
clients it is on everything loaded.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import protocol_specs

NEVER_LOADED = ["trio", "asyncio", "glide", "websockets", "redis", "anyio"]
NEVER_IMPORTED = {*NEVER_LOADED, "socket", "selectors", "ssl", "subprocess", "threading"}
MODULES = sorted(m.name for m in pkgutil.iter_modules(protocol_specs.__path__))


def test_protocol_specs_loads_no_event_loop_or_client() -> None:
    assert {"session", "wire", "dap_framing", "runs"} <= set(MODULES)
    code = (
        "import sys\n"
        + "".join(f"import protocol_specs.{m}\n" for m in MODULES)
        + f"print(sorted(m for m in {NEVER_LOADED!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", f"protocol_specs pulled in I/O modules: {out}"


def test_protocol_specs_imports_no_io_module_itself() -> None:
    for name in MODULES:
        tree = ast.parse(Path(protocol_specs.__path__[0], f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & NEVER_IMPORTED, (
                f"protocol_specs/{name}.py imports {roots & NEVER_IMPORTED}"
            )
