"""protocol_specs is sans-I/O: no event loop, socket or Redis module, directly or through imports.

Each module is imported alone in a fresh interpreter, and ``sys.modules`` is checked afterwards.

One exception, pinned precisely below: the standard library's ``socket`` (with ``selectors`` and
``threading``) is loaded when a pydantic model is *defined*. pydantic's plugin loader
(``pydantic/plugin/_loader.py``) imports ``importlib.metadata``, whose ``_adapters`` imports
``email.message`` -> ``email.utils``, which imports ``socket`` (to call ``socket.getfqdn`` in
``make_msgid``). Nothing calls into it, and it cannot be avoided while the models use pydantic, so
the test allows exactly that chain and nothing else: a module that does not use pydantic must not
load ``socket`` at all, and in every module the first import of ``socket`` must come from
``email/utils.py`` under ``importlib.metadata``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import protocol_specs

NEVER_LOADED = ["trio", "asyncio", "anyio", "glide", "websockets", "redis", "valkey", "jsonschema"]
STDLIB_IO = ["socket", "selectors", "ssl", "threading", "subprocess"]
NEVER_IMPORTED = {*NEVER_LOADED, *STDLIB_IO}
#: every module of protocol_specs, its sub-packages' too, by its full name
MODULES = sorted(m.name for m in pkgutil.walk_packages(protocol_specs.__path__, "protocol_specs."))

_PROBE = """
import json, sys, traceback

class SocketImportSpy:
    chain = None

    def find_spec(self, name, path=None, target=None):
        if name == "socket" and SocketImportSpy.chain is None:
            SocketImportSpy.chain = [
                f.filename for f in traceback.extract_stack() if not f.filename.startswith("<")
            ]
        return None

sys.meta_path.insert(0, SocketImportSpy())
import {module}
print(json.dumps({{
    "loaded": sorted(m for m in {watched!r} if m in sys.modules),
    "socket_importers": SocketImportSpy.chain,
}}))
"""


def probe(module: str) -> dict[str, Any]:
    code = _PROBE.format(module=module, watched=[*NEVER_LOADED, *STDLIB_IO, "pydantic"])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_the_modules_of_the_plan_are_all_checked() -> None:
    assert {
        "protocol_specs.dap.framing",
        "protocol_specs.dap.capabilities",
        "protocol_specs.dap.schema",
        "protocol_specs.session.session",
        "protocol_specs.wire.wire",
        "protocol_specs.runs.runs",
    } <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_loads_no_event_loop_client_or_validator(module: str) -> None:
    loaded = probe(module)["loaded"]
    assert not set(loaded) & set(NEVER_LOADED), f"{module} loaded {loaded}"


@pytest.mark.parametrize("module", MODULES)
def test_module_loads_socket_only_through_pydantic_metadata(module: str) -> None:
    result = probe(module)
    loaded, chain = set(result["loaded"]), result["socket_importers"]
    if "pydantic" not in loaded:
        assert not loaded & set(STDLIB_IO), f"{module} loaded {loaded}"
        return
    if chain is None:
        return
    assert chain[-1].replace("\\", "/").endswith("/email/utils.py"), chain
    assert any("/importlib/metadata/" in f.replace("\\", "/") for f in chain), chain
    assert any("/pydantic/plugin/" in f.replace("\\", "/") for f in chain), chain


@pytest.mark.parametrize(
    "module",
    ["protocol_specs.dap.framing", "protocol_specs.dap.capabilities", "protocol_specs.dap.schema"],
)
def test_the_dap_codec_modules_load_no_io_module_at_all(module: str) -> None:
    result = probe(module)
    assert result["loaded"] == [] and result["socket_importers"] is None


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_no_io_module_itself(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots = {node.module.split(".")[0]}
        else:
            continue
        # jsonschema is allowed inside functions only (dap_schema imports it lazily); the
        # NEVER_LOADED check above proves importing the module does not load it.
        if roots == {"jsonschema"} and module == "protocol_specs.dap.schema":
            continue
        assert not roots & NEVER_IMPORTED, f"{spec.origin} imports {roots}"


#: the decision cores of the I/O packages: sync objects that take events and return actions; their
#: trio loops (adapter/dap/server.py, worker_shim/shim.py, relay.client's RunLink) do the I/O
CORES = [
    "adapter.dap.core",
    "adapter.dap.status",
    "worker_shim.session.core",
    "worker_shim.session.replay",
    "worker_shim.session.watch",
    "worker_shim.session.actions",
    "worker_shim.session.channel",
    "worker_shim.session.child",
    "adapter.dap.processes",
    "adapter.dap.children",
]


@pytest.mark.parametrize("module", CORES)
def test_the_decision_cores_load_no_event_loop_or_client(module: str) -> None:
    loaded = probe(module)["loaded"]
    assert not set(loaded) & set(NEVER_LOADED), f"{module} loaded {loaded}"
