"""The two builds an A/B compares: a checkout directory as it is, or a git commit checked out into a
temporary worktree that is removed afterwards. A run sees only its build: the working directory and
the front of PYTHONPATH are the build's root. A commit's runs get PEGASPEC_COMMIT (what the bench
records) set to it; a directory's keep the caller's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.provenance import git_commit


@dataclass(frozen=True)
class Build:
    name: str  # "base" or "head"
    root: Path  # holds engine/
    label: str  # what the report calls it
    commit: str | None = None  # a commit build's hash

    def env(self, environ: dict[str, str]) -> dict[str, str]:
        """environ for a run of this build."""
        env = dict(environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [environ.get("PYTHONPATH")])])
        if self.commit:
            env["PEGASPEC_COMMIT"] = self.commit
        return env


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolve_commit(spec: str, repo: Path) -> str | None:
    """The full hash `spec` names in repo, or None."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        return None


@contextmanager
def checked_out(name: str, spec: str, repo: Path, scratch: Path) -> Iterator[Build]:
    """The build `spec` names: a directory holding engine/, else a commit of repo (a worktree under
    scratch for the duration)."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "engine" / "__init__.py").is_file():
            raise SystemExit(f"--{name} {spec}: no engine/ package there, not a build of this project")
        commit = git_commit(repo=path, environ={})
        yield Build(name, path.resolve(), f"{spec} (git: {commit or 'none'})")
        return
    sha = resolve_commit(spec, repo)
    if sha is None:
        raise SystemExit(f"--{name} {spec}: neither a directory nor a commit of {repo}")
    root = scratch / name
    _git(repo, "worktree", "add", "--detach", "--quiet", str(root), sha)
    try:
        yield Build(name, root, f"{spec} ({sha[:12]})", sha)
    finally:
        _git(repo, "worktree", "remove", "--force", str(root))
