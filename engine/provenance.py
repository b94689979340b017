"""The commit a result was produced at, for build manifests, bench records and gate run records."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from engine.knobs import read_gate_knobs

REPO = Path(__file__).resolve().parents[1]


def git_commit(short: bool = False, repo: Path = REPO, environ: Mapping[str, str] | None = None) -> str | None:
    """PEGASPEC_COMMIT when set in `environ` (default: os.environ; a device copy of the tree may carry
    no .git, or a stale one), else HEAD with "-dirty" when tracked files differ from it; None without
    either."""
    shipped = read_gate_knobs(environ).commit
    if shipped:
        return shipped

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True).stdout

    try:
        head = git("rev-parse", *(["--short"] if short else []), "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")
