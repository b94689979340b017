"""docs/architecture.md's floor table held to the code: every engine-core module (a package through its
face) has one row, each row's floor is the one its imports give, the core is at most 8 floors deep, and
nothing in it imports the bench, the fixture or the server."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ABOVE = ("engine.bench", "engine.fixture", "engine.serve")
PACKAGES = ("engine.kernels", "engine.hedge")  # one row each, entered through their faces
MAX_FLOORS = 8


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "engine").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not name.startswith(ABOVE) and name != "engine.__main__":
            mods[name] = path
    return mods


MODS = _modules()


def _owner(name: str) -> str | None:
    """The module an imported name lives in (`engine.policy.span.SpanPolicy` -> engine.policy.span)."""
    while name and name not in MODS:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str) -> set[str]:
    """The core modules `name` imports; a package's face does not count its own submodules."""
    path, found = MODS[name], set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            owner = _owner(n)
            face_own = path.name == "__init__.py" and owner is not None and owner.startswith(name + ".")
            if owner and owner != name and not face_own:
                found.add(owner)
    return found


@cache
def floor(name: str) -> int:
    return 1 + max((floor(d) for d in imports(name)), default=0)


def doc_rows() -> dict[str, int]:
    """module -> floor, from the table under 'Floors and modules'."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Floors and modules", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for floor_text, path in re.findall(r"^\| (\d+) \| `([^`]+)` \|", section, flags=re.M):
        name = path.removesuffix(".py").removesuffix("/").replace("/", ".")
        assert name not in rows, f"{path} has two rows"
        rows[name] = int(floor_text)
    return rows


def table_modules() -> set[str]:
    """Every core module, a package of PACKAGES as its face only; the empty face engine.policy and the
    top-level face engine (__init__) as no row."""
    mods = set()
    for name in MODS:
        package = next((p for p in PACKAGES if name == p or name.startswith(p + ".")), None)
        mods.add(package or name)
    return mods - {"engine", "engine.policy", "engine.models"}


def test_the_core_is_at_most_eight_floors_and_imports_nothing_above_it():
    assert max(floor(m) for m in MODS) <= MAX_FLOORS
    for name, path in MODS.items():
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) (" + "|".join(ABOVE) + r")\b", text, flags=re.M), name


def test_every_core_module_has_its_row_and_its_floor():
    rows = doc_rows()
    assert set(rows) == table_modules()
    wrong = {m: (rows[m], floor(m)) for m in rows if rows[m] != floor(m)}
    assert not wrong, f"doc floor != code floor: {wrong}"


def test_the_floor_rule_counts_faces_and_type_imports():
    assert floor("engine.levers") == 1 and floor("engine.kernels") == 1  # the face: only what it imports from outside
    assert "engine.runner" in imports("engine.round") and "engine.request" not in imports("engine.config")
    assert floor("engine.engine") == 1 + max(floor(d) for d in imports("engine.engine"))
