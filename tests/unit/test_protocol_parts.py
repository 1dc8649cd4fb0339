"""The protocol room's parts (its sub-packages and loose modules) import one another one way only.

``protocol_specs/`` is grouped by concern (``dap/``, ``runs/``, ``wire/``, ...): a newcomer reads a
part knowing what it may lean on, which holds only while no two parts import each other, however
far round. ``tests/import_graph.py`` reads the imports; ``docs/architecture.md`` draws the parts.
"""

from __future__ import annotations

from pathlib import Path

from import_graph import ROOMS, Graph, Import, build, cycles, part_edges


def part_graph(graph: Graph, room: str) -> Graph:
    """The room's parts as the nodes of a graph, and the imports between them as its edges."""
    (found,) = [r for r in ROOMS if r.name == room]
    edges = part_edges(graph, found)
    parts = {part for pair in edges for part in pair}
    return Graph(
        modules={part: Path(part) for part in parts},
        imports=[Import(a, b, (), 0) for a, b in edges],
    )


def test_the_protocol_parts_import_each_other_one_way() -> None:
    assert cycles(part_graph(build(), "protocol")) == []


def test_a_cycle_between_parts_is_found() -> None:
    """The check above can fail: two parts that import each other are a cycle."""
    graph = Graph(
        modules={
            "protocol_specs.one.a": Path("protocol_specs/one/a.py"),
            "protocol_specs.one.b": Path("protocol_specs/one/b.py"),
            "protocol_specs.two.c": Path("protocol_specs/two/c.py"),
            "protocol_specs.two.d": Path("protocol_specs/two/d.py"),
        },
        imports=[
            Import("protocol_specs.one.a", "protocol_specs.two.c", ("X",), 1),
            Import("protocol_specs.two.d", "protocol_specs.one.b", ("Y",), 1),
        ],
    )
    assert cycles(graph) == []  # no cycle between modules...
    assert cycles(part_graph(graph, "protocol")) == [
        ["protocol_specs/one/", "protocol_specs/two/"]
    ]  # ...but one between their parts
