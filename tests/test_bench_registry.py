"""`python -m engine.bench`: every module of engine/bench is reached from a registered bench, each
bench's --help is its own parser, and the top-level help lists every bench with its question."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.bench.__main__ import COMMANDS, main

BENCH = Path(__file__).resolve().parent.parent / "engine" / "bench"


def _module(path: Path) -> str:
    parts = path.relative_to(BENCH.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_every_bench_module_is_reached_from_a_registered_bench():
    modules = {_module(p): p for p in BENCH.rglob("*.py")}
    reached, todo = set(), [f"engine.bench.{module}" for module, _ in COMMANDS.values()]
    while todo:
        name = todo.pop()
        if name in reached or name not in modules:
            continue
        reached.add(name)
        todo += [m for m in _imports(modules[name]) if m.startswith("engine.bench")]
    packages = {"engine.bench", "engine.bench.__main__", "engine.bench.study"}
    assert sorted(set(modules) - reached - packages) == []


def test_the_help_lists_every_bench_with_its_question(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per bench
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    for name, (_, question) in COMMANDS.items():
        assert f"{name} {question}" in out
        assert question.endswith("?") or question.startswith("(")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_bench_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m engine.bench {name}")
