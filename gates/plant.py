"""Planting a canary (gates/canaries.py) in this process, and the runner a canary child starts as:

python -m gates.plant NAME -m MODULE [ARGS...]   # plant NAME, then run MODULE as __main__
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Sequence
from typing import Any

from gates.canaries import CANARIES, ENV


class CanaryError(RuntimeError):
    """A canary whose patch target no longer exists (retarget it in gates/canaries.py)."""


def resolve(target: str) -> tuple[Any, str, Any]:
    """(owner, attribute, current value) of "module:attr.path"; CanaryError when it is gone."""
    module, _, path = target.partition(":")
    try:
        owner: Any = importlib.import_module(module)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        return owner, attr, getattr(owner, attr)
    except (ImportError, AttributeError) as err:
        raise CanaryError(f"{target} is gone ({err}): retarget gates/canaries.py") from None


def plant(name: str) -> None:
    """Apply canary `name`'s patch in this process."""
    canary = CANARIES[name]
    found = {t: resolve(t) for t in canary.targets}
    for target, new in canary.patch({t: value for t, (_, _, value) in found.items()}).items():
        owner, attr, _ = found[target]
        setattr(owner, attr, new)


def canary_argv(name: str, argv: Sequence[str]) -> tuple[str, ...]:
    """A child's argv (python -m MODULE ...) run with canary `name` planted first."""
    python, *rest = argv
    return (python, "-m", "gates.plant", name, *rest)


def main(argv: Sequence[str]) -> None:
    """NAME -m MODULE [ARGS...]: plant NAME, then run MODULE with ARGS as its command line."""
    if len(argv) < 3 or argv[0] not in CANARIES or argv[1] != "-m":
        raise SystemExit(f"usage: python -m gates.plant {{{','.join(CANARIES)}}} -m MODULE [ARGS...]")
    name, module, args = argv[0], argv[2], list(argv[3:])
    plant(name)
    os.environ[ENV] = name  # a server the child starts plants it too
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
