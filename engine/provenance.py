"""The commit a result was produced at, for build manifests, bench records and gate run records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_commit(short: bool = False, repo: Path = REPO) -> str | None:
    """PEGASPEC_COMMIT when set (a device copy of the tree may carry no .git, or a stale one), else
    HEAD with "-dirty" when tracked files differ from it; None without either."""
    if os.environ.get("PEGASPEC_COMMIT"):
        return os.environ["PEGASPEC_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True).stdout

    try:
        head = git("rev-parse", *(["--short"] if short else []), "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")
