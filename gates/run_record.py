"""The levers gate's run record: rows travel from xdist workers to the controller, which writes the file.

A case attaches its row to its report (`user_properties`), which xdist ships to
the controller; the controller's RunRecorder collects rows from the call-phase
reports and, at the end of the session, prints the gate lines and writes the record
to gate-records/<UTC time>-<commit>.md under the directory pytest was started in (or
where --run-record / PEGAINFER_RUN_RECORD say). A run that did not run every case
never writes under docs/; pasting a whole run into a doc is `python -m trace_tools paste`,
which takes the newest record in gate-records/ by default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest
from filelock import FileLock

from engine.knobs import read_gate_knobs
from engine.provenance import git_commit
from gates.canaries import CANARIES
from gates.cases import ALL_CASES
from gates.devices import device_name
from gates.verdict import gate_line
from trace_tools import CanaryRow, ExcuseRow, RecordHeader, RecordRow, render_record
from trace_tools.record import RECORDS_DIR
from trace_tools.results import ExcusedLine

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORD_ENV = "PEGAINFER_RUN_RECORD"
ROW_PROPERTY = "spec_lever_row"
CANARY_PROPERTY = "spec_lever_canary"


def row_property(case_id: str, row: RecordRow, weights: str, excuses: Sequence[ExcuseRow] = ()) -> tuple[str, str]:
    """A (name, value) pair for `request.node.user_properties`; JSON so xdist can ship it."""
    data = {"case": case_id, "weights": weights, "row": dataclasses.asdict(row)}
    return ROW_PROPERTY, json.dumps(data | {"excuses": [dataclasses.asdict(e) for e in excuses]})


def read_row_property(value: str) -> tuple[str, str, RecordRow, list[ExcuseRow]]:
    data = json.loads(value)
    excuses = [ExcuseRow(e["case"], ExcusedLine(**e["excuse"])) for e in data.get("excuses", [])]
    return data["case"], data["weights"], RecordRow(**data["row"]), excuses


def canary_property(row: CanaryRow) -> tuple[str, str]:
    return CANARY_PROPERTY, json.dumps(dataclasses.asdict(row))


def canary_line(row: CanaryRow) -> str:
    verdict = "caught" if row.caught else "NOT CAUGHT (the gate cannot see it)"
    return f"spec lever canary: {row.name} on {row.case}: {verdict}: {row.named}"


def head_commit(repo: Path = REPO_ROOT, environ: Mapping[str, str] | None = None) -> str:
    """The short commit of the tree (PEGASPEC_COMMIT on a device copy), or a placeholder saying why not."""
    return git_commit(short=True, repo=repo, environ=environ) or "unknown (no git)"


def default_record(cwd: Path, stamp: datetime, head: str) -> Path:
    """cwd/gate-records/<UTC time>-<commit>.md: names sort by time, so the newest sorts last."""
    commit = re.sub(r"[^0-9A-Za-z_.-]+", "-", head).strip("-") or "unknown"
    return cwd / RECORDS_DIR / f"{stamp.astimezone(timezone.utc):%Y%m%dT%H%M%SZ}-{commit}.md"


def record_path(option: str | None, default: Path) -> Path:
    """--run-record, else $PEGAINFER_RUN_RECORD, else `default` (default_record)."""
    chosen = option or read_gate_knobs().run_record
    return Path(chosen).expanduser() if chosen else default


def guarded_path(path: Path, whole: bool, default: Path, repo: Path = REPO_ROOT) -> Path:
    """path, unless the run is partial and path lies under the repo's docs/: then `default`."""
    docs = (repo / "docs").resolve()
    if whole or not path.resolve().is_relative_to(docs):
        return path
    return default


def write_run_record(
    path: Path,
    header: RecordHeader,
    rows: Sequence[RecordRow],
    excuses: Sequence[ExcuseRow] = (),
    canaries: Sequence[CanaryRow] = (),
) -> None:
    """Write the record atomically; the lock serialises sessions that share one record file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock lives in the temp dir: a stray .lock file beside the record would end up in the repo.
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    with FileLock(Path(tempfile.gettempdir()) / f"pegaspec-run-record-{key}.lock"):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(render_record(header, rows, excuses, canaries), encoding="utf-8")
        os.replace(tmp, path)


class RunRecorder:
    """Registered on the controller only (never on an xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: dict[str, tuple[str, RecordRow, list[ExcuseRow]]] = {}  # case id -> (weights, row, excuses)
        self.canaries: dict[str, CanaryRow] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == ROW_PROPERTY:
                case_id, weights, row, excuses = read_row_property(str(value))
                self.rows[case_id] = (weights, row, excuses)  # a rerun replaces the earlier row
            elif name == CANARY_PROPERTY:
                row = CanaryRow(**json.loads(str(value)))
                self.canaries[row.name] = row

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows and not self.canaries:
            return
        ordered = [self.rows[c.id] for c in ALL_CASES if c.id in self.rows]
        canaries = [self.canaries[n] for n in CANARIES if n in self.canaries]
        terminalreporter.section("spec lever gate")
        for _, row, _ in ordered:
            terminalreporter.write_line(gate_line(row))
        for c in canaries:
            terminalreporter.write_line(canary_line(c))
        caught = sum(c.caught for c in canaries)
        terminalreporter.write_line(f"canaries: {caught} of {len(CANARIES)} caught")
        now, head = datetime.now(timezone.utc), head_commit()
        header = RecordHeader(
            head=head,
            device=device_name(),
            weights=", ".join(dict.fromkeys(w for w, _, _ in ordered)),
            date=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            command=shlex.join(["pytest", *self.config.invocation_params.args]),
            cases_run=len(ordered),
            cases_total=len(ALL_CASES),
            canaries_total=len(CANARIES),
        )
        # Under the directory pytest was started in, not pytest's temp folder (rotated after three runs).
        default = default_record(Path(self.config.invocation_params.dir), now, head)
        wanted = record_path(self.config.getoption("run_record"), default)
        whole = len(ordered) == len(ALL_CASES) and len(canaries) == len(CANARIES)
        path = guarded_path(wanted, whole, default)
        if path != wanted:
            terminalreporter.write_line(
                f"ran {len(ordered)} of {len(ALL_CASES)} cases and {len(canaries)} of {len(CANARIES)} canaries: "
                f"a partial run never writes under docs/ ({wanted} left as it was)"
            )
        excuses = [e for _, _, case_excuses in ordered for e in case_excuses]
        write_run_record(path, header, [row for _, row, _ in ordered], excuses, canaries)
        terminalreporter.write_line(f"run record written to {path}")
