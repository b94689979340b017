"""`python -m trace_tools`: summarize a child's log, paste a run record into a doc."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trace_tools.consistency import request_problems
from trace_tools.parse import TraceError, hedge_trace_rows, levers_trace_rows, lossless_lines, request_lines
from trace_tools.record import RECORDS_DIR, RecordError, paste
from trace_tools.summary import summarize, summarize_hedge


def _requests(ids: Sequence[int]) -> str:
    return " ".join(f"req-{i}" for i in ids) or "none"


def _summarize(args: argparse.Namespace) -> None:
    lines = Path(args.log).read_text(encoding="utf-8", errors="replace").splitlines()
    rows = levers_trace_rows(lines)
    s = summarize(rows)
    child = args.child or Path(args.log).stem
    max_drafts = "-" if s.max_drafts is None else s.max_drafts
    print(
        f"child={child} rounds={s.rounds} gated_rounds={s.gated_rounds} "
        f"speculating_rounds={s.speculating_rounds} max_drafts={max_drafts}"
    )
    print(f"requests: {_requests(s.requests)}")
    print(f"gated requests: {_requests(s.gated_requests)}")
    print(f"gated, never later speculating and accepting: {_requests(s.unresumed_requests)}")
    hedges = hedge_trace_rows(lines)
    if hedges:
        print(f"hedge: {summarize_hedge(hedges).line}")
    results = lossless_lines(lines)
    for r in results:
        print(f"lossless: test={r.test} requests={r.requests} compared_tokens={r.compared_tokens} excused={r.excused}")
    if not results:
        print("lossless: no [lossless] line")
    requests = request_lines(lines)
    if requests:
        problems = request_problems(rows, requests, stops=True)
        print(f"cross-check of {len(requests)} requests: " + ("ok" if not problems else f"{len(problems)} problems"))
        for p in problems:
            print(f"  - {p}")


def _write_in_place(path: Path, text: str) -> None:
    # Write beside the doc, then rename: an interrupted paste never leaves half a doc.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read_exact(path: Path) -> str:
    # newline="" keeps every byte (CRLF included) as it was.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def newest_record(records_dir: Path) -> Path:
    """The newest record the gate wrote under records_dir (its names start with the UTC time)."""
    found = sorted(records_dir.glob("*.md")) if records_dir.is_dir() else []
    if not found:
        raise RecordError(f"no run record under {records_dir}/ (run the gate there first, or pass --record)")
    return found[-1]


def _paste(args: argparse.Namespace) -> None:
    doc = Path(args.doc)
    record = Path(args.record) if args.record else newest_record(Path(RECORDS_DIR))
    old = _read_exact(doc)
    new = paste(old, _read_exact(record))
    if new == old:
        print(f"{doc}: run record already up to date")
        return
    _write_in_place(doc, new)
    print(f"{doc}: pasted {record}")


def build_parser(prog: str = "python -m trace_tools") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Read the engine's DFlash round trace and the lossless children's result lines; "
        "paste a levers-gate run record into a doc.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "summarize",
        help="summarize one child's log (round lines + [lossless] lines)",
        description="Count the `DFlash round` lines of one child's log (gated / speculating rows, "
        "widest verify, gated requests that never resume), its `DFlash hedge` lines (chains, "
        "wins, discards) and list its [lossless] lines.",
    )
    s.add_argument("log", metavar="LOG", help="a log holding one child's combined stdout/stderr")
    s.add_argument("--child", metavar="NAME", help="label for the summary line (default: LOG's file stem)")
    s.set_defaults(run=_summarize)
    p = sub.add_parser(
        "paste",
        help="paste a run record into a doc between the run-record markers",
        description="Replace what lies between `<!-- run-record:begin -->` and `<!-- run-record:end -->` "
        "in DOC with the contents of RECORD, in place; every other byte of DOC is kept. "
        "DOC must hold each marker exactly once; RECORD must be of a run that ran every case.",
    )
    p.add_argument("--doc", required=True, metavar="DOC", help="the Markdown doc to rewrite in place")
    p.add_argument(
        "--record",
        metavar="RECORD",
        help=f"the run record the gate wrote (default: the newest in ./{RECORDS_DIR}/, where the gate writes them)",
    )
    p.set_defaults(run=_paste)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m trace_tools") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        args.run(args)
    except (OSError, UnicodeDecodeError, TraceError, RecordError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
