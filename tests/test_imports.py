"""The import graph of engine/ (module-level and in-function imports alike, read from the source):
no circle, and the serving path reaches nothing in the training package engine/fixture."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Not serving: the fixture itself and the benches (which may build a pair).
OFF_SERVING = ("engine.fixture", "engine.bench")
# Ops is declared in the kernels package's __init__, which picks the Triton backend from triton_ops.
KNOWN_CIRCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "engine").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the engine modules it imports (`from pkg import mod` counts as pkg.mod)."""
    mods, graph = _modules(), {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d not in (name, "engine")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_circles_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_engine():
    assert [c for c in circles(import_graph()) if c not in KNOWN_CIRCLES] == []


def test_serving_path_imports_nothing_from_the_fixture():
    graph = import_graph()
    serving = [m for m in graph if not m.startswith(OFF_SERVING)]
    reached, todo = set(serving), list(serving)
    while todo:
        for dep in graph[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert sorted(m for m in reached if m.startswith("engine.fixture")) == []
