"""Packaging: the console script dispatches every tool, and every third-party import is declared."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from engine.console import COMMANDS, main

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# import name -> distribution name, where they differ
DISTRIBUTION = {"huggingface_hub": "huggingface-hub"}


def test_console_script_points_at_the_dispatcher():
    assert PYPROJECT["project"]["scripts"] == {"pegaspec": "engine.console:main"}
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["generate", "--help"], "pegaspec generate"),
        (["serve", "--help"], "pegaspec serve"),
        (["bench", "--help"], "python -m engine.bench"),
        (["bench", "serve-load", "--help"], "python -m engine.bench serve-load"),
        (["bench", "decode", "--help"], "python -m engine.bench decode"),
        (["fixture", "--help"], "pegaspec fixture"),
        (["trace", "--help"], "pegaspec trace"),
    ],
)
def test_each_command_reaches_its_own_parser(argv, prog, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog}")


@pytest.mark.parametrize("argv", [[], ["nope"], ["bench"], ["bench", "nope"]])
def test_unknown_or_missing_commands_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and "usage:" in capsys.readouterr().err


def _third_party_imports() -> set[str]:
    local = {"engine", "trace_tools", "gates", "tests"}
    names = set()
    for path in [*ROOT.glob("engine/**/*.py"), *ROOT.glob("trace_tools/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in local and n not in sys.stdlib_module_names}


def test_every_imported_package_is_declared():
    project = PYPROJECT["project"]
    declared = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    dists = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in declared}
    imported = _third_party_imports()
    assert {"torch", "tqdm", "starlette"} <= imported  # the scan sees top-level and lazy imports
    missing = {n for n in imported if DISTRIBUTION.get(n, n).lower() not in dists}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
