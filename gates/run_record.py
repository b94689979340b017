"""The levers gate's run record: rows travel from xdist workers to the controller, which writes the file.

A case attaches its row to its report (`user_properties`), which xdist ships to
the controller; the controller's RunRecorder collects rows from the call-phase
reports and, at the end of the session, prints the gate lines and writes the record
into the session's own output folder (or where --run-record / PEGAINFER_RUN_RECORD
say). A run that did not run every case never writes under docs/; pasting a whole
run into a doc is `python -m trace_tools paste`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest
from filelock import FileLock

from engine.knobs import read_gate_knobs
from engine.provenance import git_commit
from gates.cases import ALL_CASES
from gates.devices import device_name, device_slug
from gates.verdict import gate_line
from trace_tools import RecordHeader, RecordRow, render_record

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORD_ENV = "PEGAINFER_RUN_RECORD"
ROW_PROPERTY = "spec_lever_row"


def row_property(case_id: str, row: RecordRow, weights: str) -> tuple[str, str]:
    """A (name, value) pair for `request.node.user_properties`; JSON so xdist can ship it."""
    return ROW_PROPERTY, json.dumps({"case": case_id, "weights": weights, "row": dataclasses.asdict(row)})


def read_row_property(value: str) -> tuple[str, str, RecordRow]:
    data = json.loads(value)
    return data["case"], data["weights"], RecordRow(**data["row"])


def head_commit(repo: Path = REPO_ROOT, environ: Mapping[str, str] | None = None) -> str:
    """The short commit of the tree (PEGASPEC_COMMIT on a device copy), or a placeholder saying why not."""
    return git_commit(short=True, repo=repo, environ=environ) or "unknown (no git)"


def record_path(option: str | None, device: str, out_dir: Path) -> Path:
    """--run-record, else $PEGAINFER_RUN_RECORD, else out_dir/levers-gate-<device>.md."""
    chosen = option or read_gate_knobs().run_record
    if chosen:
        return Path(chosen).expanduser()
    return out_dir / f"levers-gate-{device_slug(device)}.md"


def guarded_path(path: Path, whole: bool, out_dir: Path, repo: Path = REPO_ROOT) -> Path:
    """path, unless the run is partial and path lies under the repo's docs/: then out_dir's record."""
    docs = (repo / "docs").resolve()
    if whole or not path.resolve().is_relative_to(docs):
        return path
    return out_dir / path.name


def write_run_record(path: Path, header: RecordHeader, rows: Sequence[RecordRow]) -> None:
    """Write the record atomically; the lock serialises sessions that share one record file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock lives in the temp dir: a stray .lock file beside the record would end up in the repo.
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    with FileLock(Path(tempfile.gettempdir()) / f"pegaspec-run-record-{key}.lock"):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(render_record(header, rows), encoding="utf-8")
        os.replace(tmp, path)


class RunRecorder:
    """Registered on the controller only (never on an xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: dict[str, tuple[str, RecordRow]] = {}  # case id -> (weights label, row)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == ROW_PROPERTY:
                case_id, weights, row = read_row_property(str(value))
                self.rows[case_id] = (weights, row)  # a rerun replaces the earlier row

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows:
            return
        ordered = [self.rows[c.id] for c in ALL_CASES if c.id in self.rows]
        terminalreporter.section("spec lever gate")
        for _, row in ordered:
            terminalreporter.write_line(gate_line(row))
        device = device_name()
        header = RecordHeader(
            head=head_commit(),
            device=device,
            weights=", ".join(dict.fromkeys(w for w, _ in ordered)),
            date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            command=shlex.join(["pytest", *self.config.invocation_params.args]),
            cases_run=len(ordered),
            cases_total=len(ALL_CASES),
        )
        # The session's own output folder: pytest's base temp dir (--basetemp), which pytest offers
        # plugins only through this attribute (the tmp_path_factory fixture needs a test).
        out_dir = self.config._tmp_path_factory.getbasetemp()
        wanted = record_path(self.config.getoption("run_record"), device, out_dir)
        path = guarded_path(wanted, len(ordered) == len(ALL_CASES), out_dir)
        if path != wanted:
            terminalreporter.write_line(
                f"ran {len(ordered)} of {len(ALL_CASES)} cases: a partial run never writes under docs/ "
                f"({wanted} left as it was)"
            )
        write_run_record(path, header, [row for _, row in ordered])
        terminalreporter.write_line(f"run record written to {path}")
