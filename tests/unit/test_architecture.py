"""The house keeps its shape: no import cycle, no import against the floors, small rooms.

The import graph is read from the source by ``tests/import_graph.py``; the layering checked here
is the one ``docs/architecture.md`` documents, and its diagram must be the one drawn from the code.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from import_graph import (
    ALLOWED,
    BEGIN,
    DOC,
    END,
    ROOMS,
    ROOT,
    Graph,
    Import,
    Room,
    build,
    cycles,
    floors,
    generated,
    part_of,
    room_of,
)

MAX_LINES = 600
#: where the limit does not apply, and why
LONG_FILES_ALLOWED: dict[str, str] = {}
#: the only ``sys.path`` edits outside the tests, and why they are not import tricks of ours
SYS_PATH_EDITS_ALLOWED = {
    "worker_shim/inject/_tether_debugpy_boot.py": "runs inside the user's program: it gives the "
    "program the sys.path plain `python script.py` would, and puts debugpy's home on it",
    "worker_shim/inject/_tether_sitecustomize.py": "runs inside a Python process a non-Python "
    "command of a debug run starts: it puts the worker's pydevd on the path, as pydevd's own "
    "patching of a child does, and takes its own directory off",
    "worker_shim/inject/_tether_breakpoint.py": "pydevd's preimport in each debugged process: "
    "it imports debugpy's own preimport from beside pydevd for a moment, as pydevd does",
}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build()


def _crosses(imp: Import) -> bool:
    return room_of(imp.source) != room_of(imp.target)


def test_no_import_cycle(graph: Graph) -> None:
    assert cycles(graph) == []


def test_every_room_is_a_folder_of_the_layout() -> None:
    """The rooms are the folders: a room whose package moved or went is not silently empty."""
    assert [
        room.folder for room in ROOMS if not (ROOT / room.folder / "__init__.py").is_file()
    ] == []
    names = [room.name for room in ROOMS]
    assert len(set(names)) == len(names)
    assert {name for room in ROOMS for name in room.may_import} <= set(names)


def test_the_rooms_stand_on_floors() -> None:
    """The table of allowed imports has floors: no two rooms may import each other, however far
    round; a table that lets them is refused."""
    assert floors() == {
        "protocol": 0,
        "link client": 1,
        "relay": 2,
        "worker": 2,
        "adapter": 2,
        "cli": 3,
    }
    circular = [
        Room("a", "a", "", frozenset({"b"})),
        Room("b", "b", "", frozenset({"c"})),
        Room("c", "c", "", frozenset({"a"})),
    ]
    with pytest.raises(ValueError, match="may import each other"):
        floors(circular)


def test_nothing_imports_against_the_layering(graph: Graph) -> None:
    wrong = [
        f"{imp.source}:{imp.line} ({room_of(imp.source)}) imports {imp.target} "
        f"({room_of(imp.target)})"
        for imp in graph.imports
        if _crosses(imp) and room_of(imp.target) not in ALLOWED[room_of(imp.source)]
    ]
    assert wrong == []


def _all_of(path: Path) -> set[str] | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def test_other_rooms_import_only_public_names(graph: Graph) -> None:
    """Across rooms: no ``_private`` name, and every name imported is in the module's ``__all__``."""
    wrong = []
    for imp in graph.imports:
        if not _crosses(imp):
            continue
        public = _all_of(graph.modules[imp.target])
        for name in imp.names:
            if name.startswith("_") or imp.target.rpartition(".")[2].startswith("_"):
                wrong.append(f"{imp.source}:{imp.line} imports private {imp.target}.{name}")
            elif public is None:
                wrong.append(f"{imp.target} has no __all__ ({imp.source} imports {name})")
            elif name not in public:
                wrong.append(f"{imp.source}:{imp.line} imports {name}, not in {imp.target}.__all__")
    assert wrong == []


def _sources() -> list[Path]:
    return [
        path
        for package in ("protocol_specs", "relay", "worker_shim", "adapter", "bench")
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_no_source_file_is_too_long() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _sources()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
        and str(path.relative_to(ROOT)) not in LONG_FILES_ALLOWED
    }
    assert long == {}


def test_no_sys_path_edits_outside_the_tests() -> None:
    edits = [
        str(path.relative_to(ROOT))
        for path in _sources()
        if "sys.path" in path.read_text()
        and str(path.relative_to(ROOT)) not in SYS_PATH_EDITS_ALLOWED
    ]
    assert edits == []


def test_every_package_is_installed() -> None:
    """``pyproject.toml`` lists packages one by one: a package missing there works in the editable
    install the tests use, and is absent from a real one."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for package in ("protocol_specs", "relay", "worker_shim", "adapter")
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert packages - listed == set()


def test_every_data_folder_is_a_listed_package_with_its_files() -> None:
    """A folder under a package that holds files (``relay/web/static``) is, to setuptools, a
    package too: one left out of ``packages`` is warned about, some 40 lines, at every install, and
    a file no ``package-data`` pattern matches is missing from a real install."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, data = set(config["packages"]), config["package-data"]
    folders, unshipped = set(), []
    for package in ("protocol_specs", "relay", "worker_shim", "adapter"):
        for path in sorted((ROOT / package).rglob("*")):
            if "__pycache__" in path.parts or path.suffix in (".py", ".pyc"):
                continue
            if path.is_dir():
                folders.add(".".join(path.relative_to(ROOT).parts))
                continue
            owner = ".".join(path.parent.relative_to(ROOT).parts)
            if not any(path.match(pattern) for pattern in data.get(owner, [])):
                unshipped.append(str(path.relative_to(ROOT)))
    assert folders - listed == set()
    assert unshipped == []
    assert config.get("package-dir") == {"": "."}, "the root layout, said: a quiet editable install"


def test_the_documented_diagram_is_drawn_from_the_code(graph: Graph) -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text
    drawn = text.partition(BEGIN)[2].partition(END)[0].strip()
    assert drawn == generated(graph), "run: .venv/bin/python tests/import_graph.py --write"


def test_the_graph_reader_sees_imports_and_cycles(tmp_path: Path) -> None:
    """The checks above can fail: the reader finds a planted cycle and a function-level import."""
    graph = Graph(
        modules={"adapter.a": tmp_path / "a.py", "adapter.b": tmp_path / "b.py"},
        imports=[
            Import("adapter.a", "adapter.b", ("f",), 1),
            Import("adapter.b", "adapter.a", ("g",), 9),
        ],
    )
    assert cycles(graph) == [["adapter.a", "adapter.b"]]
    real = build()
    hidden = [
        i for i in real.imports if i.source == "adapter.cli" or i.source.startswith("adapter.cli.")
    ]
    assert hidden, "the CLI's imports (many inside functions) are seen"
    assert room_of("relay.client") == "link client"
    assert room_of("relay.client.link") == "link client"
    assert room_of("relay.links") == "relay"
    assert room_of("relay.links.links") == "relay"
    assert room_of("adapter.cli.runs") == "cli"
    assert part_of(real, "relay.links.links") == "relay/links/"
    assert part_of(real, "relay.links") == "relay/links/"
    assert part_of(real, "relay.gate") == "relay/gate.py"
    assert part_of(real, "relay") == "relay/"
