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

#: the rooms of the house, lowest floor first: (room, what lives there, its modules' prefixes).
#: A module belongs to the room of the longest prefix it matches.
ROOMS: list[tuple[str, str, tuple[str, ...]]] = [
    ("protocol", "protocol_specs: the protocols and state machines, sans-I/O", ("protocol_specs",)),
    (
        "link client",
        "relay.client: a relay's client, the adapter's and the worker's",
        ("relay.client",),
    ),
    ("relay", "relay: the service", ("relay",)),
    ("worker", "worker_shim: the GPU node's side", ("worker_shim",)),
    ("adapter", "adapter: the local DAP adapter", ("adapter",)),
    (
        "cli",
        "adapter.cli: the commands; composes everything",
        ("adapter.cli",),
    ),
]
#: the rooms each room may import from (besides itself); nothing imports a floor above its own
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "link client": {"protocol"},
    "relay": {"protocol", "link client"},
    "worker": {"protocol", "link client"},
    "adapter": {"protocol", "link client"},
    "cli": {"protocol", "link client", "relay", "worker", "adapter"},
}


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


def room_of(module: str) -> str:
    """The room of the longest prefix that names the module or a package above it."""
    matches = [
        (len(prefix), room)
        for room, _, prefixes in ROOMS
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise KeyError(module)
    return max(matches)[1]


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
    ids = {room: f"r{i}" for i, (room, _, _) in enumerate(ROOMS)}
    members: dict[str, list[str]] = defaultdict(list)
    for module in sorted(graph.modules):
        members[room_of(module)].append(module)
    lines = ["```mermaid", "flowchart BT"]
    for room, what, _ in ROOMS:
        lines.append(f'  {ids[room]}["<b>{room}</b><br/>{what}<br/>{len(members[room])} modules"]')
    for (a, b), n in room_edges(graph).items():
        lines.append(f"  {ids[a]} -->|{n}| {ids[b]}")
    lines.append("```")
    return "\n".join(lines)


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
    for room, what, _ in ROOMS:
        lines += ["", f"**{room}** ({what})", "", "| module | its job |", "|---|---|"]
        lines += [
            f"| `{m}` | {_summary(graph.modules[m]) or '(no docstring)'} |" for m in members[room]
        ]
    return "\n".join(lines).strip()


def generated(graph: Graph) -> str:
    return f"{diagram(graph)}\n\n{module_map(graph)}"


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
