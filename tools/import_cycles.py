"""Fail on any import circle among the project's modules, reading every import statement with the AST: those at the
top of a module and those inside functions alike (a lazy import closes a circle as surely, only later). Imports under
``if TYPE_CHECKING:`` are left out: they never run.

Usage: ``python tools/import_cycles.py [PACKAGE_DIR ...]`` (default: service model). Prints each circle as
``a -> b -> a`` with where each import is, and exits 1 when there is one.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path


def modules(roots: list[Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the package directories ``roots``."""
    found: dict[str, Path] = {}
    for root in roots:
        for file in sorted(root.rglob("*.py")):
            parts = file.relative_to(root.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = file
    return found


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: skips the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in runtime_imports(ast.Module(body=[child], type_ignores=[])))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from runtime_imports(node)


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The project modules that ``node`` in ``module`` imports: ``from a import b`` names ``a.b`` when that is a
    module, else ``a``; ``import a.b`` names the longest known prefix."""

    def known_prefix(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        names = [known_prefix(alias.name) for alias in node.names]
        return [n for n in names if n]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = []
    for alias in node.names:
        name = known_prefix(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else known_prefix(base)
        if name:
            out.append(name)
    return out


def graph(known: dict[str, Path]) -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of the first such import}."""
    edges: dict[str, dict[str, str]] = {}
    for module, file in known.items():
        tree = ast.parse(file.read_text(), str(file))
        edges[module] = {}
        for node in runtime_imports(tree):
            for target in targets(node, module, file.name == "__init__.py", known):
                if target != module:
                    edges[module].setdefault(target, f"{file}:{node.lineno}")
    return edges


def circles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def path_through(component: list[str], edges: dict[str, dict[str, str]]) -> list[str]:
    """The shortest circle inside ``component`` from its first module back to it (breadth-first)."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        step = []
        for node in frontier:
            if start in edges[node]:
                route = [node]
                while route[-1] != start:
                    route.append(came_from[route[-1]])
                return [*route[::-1], start]
            for child in sorted(edges[node]):
                if child in members and child not in came_from and child != start:
                    came_from[child] = node
                    step.append(child)
        frontier = step
    raise AssertionError(f"no circle through {start}")


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("service"), Path("model")]
    edges = graph(modules(roots))
    found = circles(edges)
    for component in found:
        route = path_through(component, edges)
        where = ", ".join(edges[a][b] for a, b in itertools.pairwise(route))
        print(f"import circle: {' -> '.join(route)} ({where})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
