"""tether's import graph, read from the source (``ast``, nothing imported), and the rooms it forms.

``tests/unit/test_architecture.py`` checks the graph against the layering that
``docs/architecture.md`` documents, and that the diagram there is the one drawn here from the code.
``python tests/import_graph.py`` prints the diagram; ``--write`` puts it into the doc.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol_specs", "relay", "worker_shim", "adapter")
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- import-graph:begin -->", "<!-- import-graph:end -->"


@dataclass(frozen=True)
class Room:
    name: str
    folder: str  #: the package that is the room, from the root (``relay/client``)
    what: str  #: what lives there
    may_import: frozenset[str] = frozenset()  #: the rooms it may import from, besides itself


#: The rooms of the house and the imports allowed between them, in one table, lowest floor first.
#: A room is a folder: a module belongs to the room of the deepest folder here that holds it, so a
#: sub-package not named here (``relay/links/``) is a part of the room around it. Nothing imports a
#: room that is not on a lower floor than its own (a room's floor: one above the highest it may
#: import, :func:`floors`).
ROOMS: list[Room] = [
    Room("protocol", "protocol_specs", "the protocols and state machines, sans-I/O"),
    Room(
        "link client",
        "relay/client",
        "a relay's client, the adapter's and the worker's",
        frozenset({"protocol"}),
    ),
    Room("relay", "relay", "the service", frozenset({"protocol", "link client"})),
    Room("worker", "worker_shim", "the GPU node's side", frozenset({"protocol", "link client"})),
    Room(
        "adapter",
        "adapter",
        "the user's side: the DAP adapter, snapshots, what is shown",
        frozenset({"protocol", "link client"}),
    ),
    Room(
        "cli",
        "adapter/cli",
        "the commands; composes everything",
        frozenset({"protocol", "link client", "relay", "worker", "adapter"}),
    ),
]
#: the rooms each room may import from (besides itself): the table above, by room
ALLOWED: dict[str, frozenset[str]] = {room.name: room.may_import for room in ROOMS}


def floors(rooms: list[Room] = ROOMS) -> dict[str, int]:
    """Each room's floor: 0 for one that imports no other room, else one above the highest it may
    import. Raises ``ValueError`` when the table lets rooms import each other (no floors then)."""
    allowed = {room.name: room.may_import for room in rooms}
    found: dict[str, int] = {}

    def floor(name: str, seen: tuple[str, ...]) -> int:
        if name in seen:
            raise ValueError(f"the rooms {' -> '.join((*seen, name))} may import each other")
        if name not in found:
            below = [floor(other, (*seen, name)) for other in allowed[name]]
            found[name] = 1 + max(below) if below else 0
        return found[name]

    for room in rooms:
        floor(room.name, ())
    return found


@dataclass(frozen=True)
class Import:
    source: str  #: the importing module
    target: str  #: the imported module (ours)
    names: tuple[str, ...]  #: ``from target import names`` (empty for ``import target``)
    line: int


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for imp in self.imports:
            if imp.target != imp.source:
                out[imp.source].add(imp.target)
        return out


def _room_at(module: str) -> Room:
    """The room of the deepest folder that holds the module (or is the package it names)."""
    path = module.split(".")
    matches = [
        room for room in ROOMS if path[: len(room.folder.split("/"))] == room.folder.split("/")
    ]
    if not matches:
        raise KeyError(module)
    return max(matches, key=lambda room: len(room.folder.split("/")))


def room_of(module: str) -> str:
    """The name of the module's room: that of the deepest room folder that holds it."""
    return _room_at(module).name


def part_of(graph: Graph, module: str) -> str:
    """The part of its room a module is in: the room's sub-package that holds it (``relay/links/``),
    or the module itself where it sits in the room's own folder (``relay/gate.py``)."""
    room = _room_at(module)
    rest = module.split(".")[len(room.folder.split("/")) :]
    if not rest:
        return f"{room.folder}/"
    if len(rest) > 1 or graph.modules[module].name == "__init__.py":
        return f"{room.folder}/{rest[0]}/"
    return f"{room.folder}/{rest[0]}.py"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def build() -> Graph:
    graph = Graph()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            graph.modules[_module_name(path)] = path
    for module, path in graph.modules.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    drop = node.level - (1 if is_package else 0)
                    anchor = anchor[: len(anchor) - drop] if drop else anchor
                    base = ".".join([*anchor, base] if base else anchor)
                names = tuple(alias.name for alias in node.names)
                submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in graph.modules]
                rest = tuple(n for n in names if f"{base}.{n}" not in graph.modules)
                targets = [(sub, ()) for sub in submodules] + ([(base, rest)] if rest else [])
            else:
                continue
            if _type_checking_only(node, parents):
                continue
            for target, names in targets:
                while target and target not in graph.modules and "." in target:
                    target = target.rsplit(".", 1)[0]  # ``import a.b.c`` of a name inside a.b
                if target in graph.modules:
                    graph.imports.append(Import(module, target, names, node.lineno))
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Every import cycle (each strongly connected component of more than one module), sorted."""
    edges, index, low, stack, on_stack = graph.edges(), {}, {}, [], set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return sorted(found)


def room_edges(graph: Graph) -> dict[tuple[str, str], int]:
    """How many module-to-module imports go from one room to another."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for source, targets in graph.edges().items():
        for target in targets:
            a, b = room_of(source), room_of(target)
            if a != b:
                counts[a, b] += 1
    return dict(sorted(counts.items()))


def diagram(graph: Graph) -> str:
    """The rooms and the imports between them, as a Mermaid flowchart (arrows point at the import)."""
    ids = {room.name: f"r{i}" for i, room in enumerate(ROOMS)}
    members: dict[str, list[str]] = defaultdict(list)
    for module in sorted(graph.modules):
        members[room_of(module)].append(module)
    floor = floors()
    lines = ["```mermaid", "flowchart BT"]
    for room in ROOMS:
        lines.append(
            f'  {ids[room.name]}["<b>{room.name}</b> (floor {floor[room.name]})<br/>'
            f'{room.folder}/: {room.what}<br/>{len(members[room.name])} modules"]'
        )
    for (a, b), n in room_edges(graph).items():
        lines.append(f"  {ids[a]} -->|{n}| {ids[b]}")
    lines.append("```")
    return "\n".join(lines)


def part_edges(graph: Graph, room: Room) -> dict[tuple[str, str], int]:
    """How many module-to-module imports go from one part of the room to another."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for source, targets in graph.edges().items():
        for target in targets:
            if room_of(source) == room_of(target) == room.name:
                a, b = part_of(graph, source), part_of(graph, target)
                if a != b:
                    counts[a, b] += 1
    return dict(sorted(counts.items()))


def parts_diagram(graph: Graph, room: Room) -> str:
    """The parts of one room (its sub-packages and its own modules; the package's ``__init__``
    left out) and the imports between them, as a Mermaid flowchart."""
    members: dict[str, list[str]] = defaultdict(list)
    for module in sorted(graph.modules):
        if room_of(module) == room.name and part_of(graph, module) != f"{room.folder}/":
            members[part_of(graph, module)].append(module)
    ids = {part: f"p{i}" for i, part in enumerate(sorted(members))}
    lines = ["```mermaid", "flowchart BT"]
    for part, modules in sorted(members.items()):
        label = part.removeprefix(f"{room.folder}/")
        count = f"<br/>{len(modules)} modules" if part.endswith("/") else ""
        lines.append(f'  {ids[part]}["{label}{count}"]')
    for (a, b), n in part_edges(graph, room).items():
        if a in ids and b in ids:
            lines.append(f"  {ids[a]} -->|{n}| {ids[b]}")
    lines.append("```")
    return "\n".join(lines)


def rooms_with_parts(graph: Graph) -> list[Room]:
    """The rooms that hold a sub-package of their own (a part that is a folder)."""
    return [
        room
        for room in ROOMS
        if any(
            room_of(m) == room.name
            and part_of(graph, m).endswith("/")
            and part_of(graph, m) != f"{room.folder}/"
            for m in graph.modules
        )
    ]


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    return first.replace("|", "\\|")


def module_map(graph: Graph) -> str:
    """Every module by room, with the first paragraph of its docstring: its job."""
    members: dict[str, list[str]] = defaultdict(list)
    for module in sorted(graph.modules):
        members[room_of(module)].append(module)
    lines = []
    for room in ROOMS:
        lines += ["", f"**{room.name}** ({room.folder}/: {room.what})", ""]
        lines += ["| module | its job |", "|---|---|"]
        lines += [
            f"| `{m}` | {_summary(graph.modules[m]) or '(no docstring)'} |"
            for m in members[room.name]
        ]
    return "\n".join(lines).strip()


def generated(graph: Graph) -> str:
    parts = [
        f"The parts of the **{room.name}** room (`{room.folder}/`): its sub-packages and its own "
        f"modules.\n\n{parts_diagram(graph, room)}"
        for room in rooms_with_parts(graph)
    ]
    return "\n\n".join([diagram(graph), *parts, module_map(graph)])


def write_doc(graph: Graph) -> bool:
    """Put the diagram between the markers in docs/architecture.md; True when it changed."""
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{generated(graph)}\n{END}{tail}"
    if new != text:
        DOC.write_text(new)
    return new != text


if __name__ == "__main__":
    g = build()
    if "--write" in sys.argv:
        print("docs/architecture.md", "updated" if write_doc(g) else "already true")
    else:
        print(generated(g))
