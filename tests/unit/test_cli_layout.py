"""The CLI is the composition root: the only part of ``adapter`` that starts the relay server or
the worker pool, and nothing in ``adapter`` imports it back. Its own modules import one way."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "adapter"
CLI = ADAPTER / "cli"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Every module ``path`` imports (at any depth, or only at its top level)."""
    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_only_the_cli_imports_the_relay_server_the_pool_or_the_cli() -> None:
    offenders = []
    for path in sorted(ADAPTER.glob("*.py")):
        for name in _imports(path):
            server_side = name.startswith("relay.") and not name.startswith("relay.client")
            if server_side or name.startswith(("adapter.cli", "worker_shim.pool")):
                offenders.append(f"{_module(path)} imports {name}")
    assert offenders == []


def test_the_cli_modules_import_one_way() -> None:
    graph = {
        _module(path): {
            name
            for name in _imports(path, top_level_only=True)
            if name.startswith("adapter.cli.") and (CLI / f"{name.split('.')[2]}.py").exists()
        }
        for path in CLI.glob("*.py")
        if path.name != "__main__.py"
    }
    graph = {m: {n.rsplit(".", n.count(".") - 2)[0] for n in deps} for m, deps in graph.items()}

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        for dep in graph.get(node, ()):
            found = cycle_from(dep, [*path, node])
            if found:
                return found
        return None

    for module in graph:
        assert cycle_from(module, []) is None
