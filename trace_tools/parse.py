"""Parsing the engine's per-round trace (round and hedge lines) and the lossless children's request
and result lines (`[lossless]`, and `[known]` from the known-continuation child).

A field is read as the first non-empty run of ASCII digits in the value that
follows `name=` (the value ends at whitespace), so `request=req-3` reads 3.
Names match at a word boundary, so `accepted_draft=` never matches inside
`xaccepted_draft=`. Field order is free and unknown fields are ignored. Round
lines of older logs lack `draft_ctx=` and `span_limit=`: those read as None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

ROUND_MARKER = re.compile(r"\bDFlash round\b")
HEDGE_MARKER = re.compile(r"\bDFlash hedge\b")
REQUEST_MARKER = re.compile(r"\bDFlash request\b")
LOSSLESS_MARKER = "[lossless]"

ROUND_FIELDS = ("request", "gated", "verified_draft", "accepted_draft", "committed_tokens")
ROUND_OPTIONAL = ("draft_ctx", "span_limit")
HEDGE_FIELDS = ("request", "chains", "winner", "main_accepted", "best_accepted")
REQUEST_FIELDS = ("request", "prompt_tokens", "output_tokens", "max_tokens")
LOSSLESS_COUNTS = ("requests", "compared_tokens", "excused")
KNOWN_MARKER = "[known]"
KNOWN_COUNTS = ("requests", "compared_tokens", "mismatches", "plain_mismatches")
_REAL = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


class TraceError(ValueError):
    """A line that announces itself as a round or lossless line but cannot be read."""


@dataclass(frozen=True)
class RoundRow:
    request: int
    gated: bool
    verified_draft: int
    accepted_draft: int
    committed_tokens: int
    draft_ctx: int | None = None  # drafter context rows after the round (stored + pending)
    span_limit: int | None = None  # drafts the round allowed (0 when gated)


@dataclass(frozen=True)
class RequestLine:
    """A lossless child's summary of one request it ran on the speculative engine."""

    request: int
    prompt_tokens: int
    output_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class HedgeRow:
    """One hedged request in one round: chains verified besides the main one, the winner (0 = the
    main chain, i = its i-th chain) and the main and winning chains' accepted drafts."""

    request: int
    chains: int
    winner: int
    main_accepted: int
    best_accepted: int


@dataclass(frozen=True)
class LosslessLine:
    test: str
    requests: int
    compared_tokens: int
    excused: int


@dataclass(frozen=True)
class KnownLine:
    """The known-continuation child's outputs against the known continuation: the speculative
    outputs that left it (mismatches) and the plain ones (plain_mismatches)."""

    geometry: str
    profile: str
    requests: int
    compared_tokens: int
    mismatches: int
    plain_mismatches: int


def _value(text: str, name: str) -> str | None:
    # `\S*` bounds the value at whitespace: `gated= verified_draft=4` must not read gated as 4.
    m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}=(\S*)", text)
    return None if m is None else m.group(1)


def _counts(text: str, names: tuple[str, ...], lineno: int, line: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        value = _value(text, name)
        digits = None if value is None else re.search(r"[0-9]+", value)  # [0-9], not \d: ASCII only
        if digits is None:
            what = "lacks" if value is None else "has no digits in"
            raise TraceError(f"line {lineno}: {what} field {name}=: {line.rstrip()!r}")
        out[name] = int(digits.group())
    return out


def _check_lines(lines: Iterable[str]) -> None:
    if isinstance(lines, str):  # iterating a str yields characters: no line would ever match
        raise TypeError("pass an iterable of lines (e.g. text.splitlines()), not one string")


def levers_trace_rows(lines: Iterable[str]) -> list[RoundRow]:
    """One RoundRow per `DFlash round` line, in input order; other lines are ignored."""
    _check_lines(lines)
    rows = []
    for lineno, line in enumerate(lines, 1):
        m = ROUND_MARKER.search(line)
        if m is None:
            continue
        text = line[m.end() :]
        f = _counts(text, ROUND_FIELDS, lineno, line)
        if f["gated"] not in (0, 1):
            raise TraceError(f"line {lineno}: gated={f['gated']} is neither 0 nor 1: {line.rstrip()!r}")
        present = tuple(name for name in ROUND_OPTIONAL if _value(text, name) is not None)
        f |= _counts(text, present, lineno, line)
        f["gated"] = f["gated"] == 1
        rows.append(RoundRow(**f))
    return rows


def request_lines(lines: Iterable[str]) -> list[RequestLine]:
    """One RequestLine per `DFlash request` line a lossless child printed, in input order."""
    _check_lines(lines)
    out = []
    for lineno, line in enumerate(lines, 1):
        m = REQUEST_MARKER.search(line)
        if m is not None:
            out.append(RequestLine(**_counts(line[m.end() :], REQUEST_FIELDS, lineno, line)))
    return out


def hedge_trace_rows(lines: Iterable[str]) -> list[HedgeRow]:
    """One HedgeRow per `DFlash hedge` line, in input order; other lines are ignored. A line whose
    winner is outside 0..chains, or whose winner accepts no more than the main chain (or a main
    winner that does not equal it), is an error: the engine never prints one."""
    _check_lines(lines)
    rows = []
    for lineno, line in enumerate(lines, 1):
        m = HEDGE_MARKER.search(line)
        if m is None:
            continue
        row = HedgeRow(**_counts(line[m.end() :], HEDGE_FIELDS, lineno, line))
        if row.winner > row.chains:
            raise TraceError(f"line {lineno}: winner={row.winner} but only {row.chains} chains: {line.rstrip()!r}")
        if (row.best_accepted > row.main_accepted) != (row.winner > 0) or row.best_accepted < row.main_accepted:
            raise TraceError(
                f"line {lineno}: winner={row.winner} disagrees with main_accepted="
                f"{row.main_accepted} best_accepted={row.best_accepted}: {line.rstrip()!r}"
            )
        rows.append(row)
    return rows


def _reals(text: str, names: tuple[str, ...], lineno: int, line: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in names:
        value = _value(text, name)
        if value is None or not _REAL.fullmatch(value):
            what = "lacks" if value is None else "has no number in"
            raise TraceError(f"line {lineno}: {what} field {name}=: {line.rstrip()!r}")
        out[name] = float(value)
    return out


def _marked(
    lines: Iterable[str], marker: str, names: Sequence[str], counts: tuple[str, ...], reals: tuple[str, ...] = ()
) -> Iterator[dict]:
    """The fields of each line carrying `marker`: the named text fields (each required), the counts
    and the real numbers (a decimal or exponent float)."""
    _check_lines(lines)
    for lineno, line in enumerate(lines, 1):
        at = line.find(marker)
        if at < 0:
            continue
        text = line[at + len(marker) :]
        fields = {name: _value(text, name) for name in names}
        for name, value in fields.items():
            if not value:
                raise TraceError(f"line {lineno}: lacks field {name}=: {line.rstrip()!r}")
        yield {**fields, **_counts(text, counts, lineno, line), **_reals(text, reals, lineno, line)}


def lossless_lines(lines: Iterable[str]) -> list[LosslessLine]:
    """One LosslessLine per `[lossless]` line printed by a lossless child test."""
    return [LosslessLine(**f) for f in _marked(lines, LOSSLESS_MARKER, ("test",), LOSSLESS_COUNTS)]


def known_lines(lines: Iterable[str]) -> list[KnownLine]:
    """One KnownLine per `[known]` line printed by the known-continuation child."""
    return [KnownLine(**f) for f in _marked(lines, KNOWN_MARKER, ("geometry", "profile"), KNOWN_COUNTS)]
