"""Every PEGAINFER_* environment variable: declared once, parsed and validated in one place.

Read once, at the engine's one start path, before any weight is read. A malformed value refuses
to start with an error naming the variable and showing the value; unset and `0` mean off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_COUNT = re.compile(r"\+?[0-9]+", re.ASCII)
_MAX_COUNT = 2**64 - 1


class KnobError(ValueError):
    """A PEGAINFER_* variable with a value the engine refuses to start with."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "count", "counts" (comma-separated), "flag" (0/1), "path"
    doc: str


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "PEGAINFER_SPEC_MAX_BATCH",
            "count",
            "load gate: while the active batch is >= n, verify one token (gated round)",
        ),
        Knob("PEGAINFER_SPEC_MAX_DRAFTS", "count", "static trim: only the first k drafts enter the verify span"),
        Knob("PEGAINFER_SPEC_HEDGE", "count", "hedged verify: extra chains for up to h greedy requests a round"),
        Knob("PEGAINFER_SPEC_HEDGE_POSITIONS", "counts", "draft positions where hedge chains branch, e.g. 0,1,2"),
        Knob("PEGAINFER_SPEC_HEDGE_AUTO", "flag", "auto-hedge controller picks the chain count from measured tok/s"),
        Knob("PEGAINFER_SPEC_HEDGE_KNEE", "count", "rows the verify forward takes nearly free; hedging stays under it"),
        Knob("PEGAINFER_TEST_LOG", "flag", "per-round trace lines on stderr"),
        Knob("PEGAINFER_TEST_MODEL_PATH", "path", "gate target weights (default: the shipped fixture pair)"),
        Knob("PEGAINFER_DFLASH_TEST_MODEL_PATH", "path", "gate drafter weights (default: the shipped fixture pair)"),
        Knob(
            "PEGAINFER_TEST_HEDGE_DRAFTER",
            "path",
            "a Markov-head (DSpark) drafter for the hedge gate case; the lossless children use it in place of "
            "the pair's drafter (default for the fixture pair: its drafter-dspark)",
        ),
        Knob("PEGAINFER_REQUIRE_SPEC_GATE", "flag", "turn every gate skip into a failure"),
        Knob("PEGAINFER_TEST_BATCH_INVARIANT", "flag", "gates run batch-invariant numerics and excuse no divergence"),
        Knob("PEGAINFER_RUN_RECORD", "path", "where the gate session writes its run-record table"),
    )
}
_SPEC_PREFIX = "PEGAINFER_SPEC_"


def _text(name: str, raw: str) -> str:
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        shown = raw.encode("utf-8", "surrogateescape")
        raise KnobError(f"{name}={shown!r} is not valid UTF-8; expected an unsigned decimal count") from None
    return raw


def parse_count(name: str, raw: str) -> int:
    """A plain unsigned decimal: optional leading '+', then ASCII digits, below 2**64."""
    text = _text(name, raw)
    if not _COUNT.fullmatch(text):
        raise KnobError(f"{name}={text!r} is not an unsigned decimal count (e.g. 0, 4, +2); refusing to start")
    value = int(text)
    if value > _MAX_COUNT:
        raise KnobError(f"{name}={text!r} does not fit in 64 bits; refusing to start")
    return value


def parse_flag(name: str, raw: str) -> bool:
    value = parse_count(name, raw)
    if value > 1:
        raise KnobError(f"{name}={raw!r} must be 0 or 1")
    return value == 1


def parse_counts(name: str, raw: str) -> tuple[int, ...]:
    text = _text(name, raw)
    if text == "":
        raise KnobError(f"{name}='' is blank; expected comma-separated counts like 0,1,2 (unset it to turn it off)")
    return tuple(parse_count(name, part) for part in text.split(","))


@dataclass(frozen=True)
class SpecKnobs:
    max_batch: int = 0
    max_drafts: int = 0
    hedge: int = 0
    hedge_positions: tuple[int, ...] = ()
    hedge_auto: bool = False
    hedge_knee: int = 0


@dataclass(frozen=True)
class Knobs:
    spec: SpecKnobs = field(default_factory=SpecKnobs)
    test_log: bool = False


def read_knobs(environ: Mapping[str, str] | None = None) -> Knobs:
    """Validate every PEGAINFER_* variable in `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    for name in env:
        if name.startswith(_SPEC_PREFIX) and name not in KNOBS:
            known = ", ".join(k for k in KNOBS if k.startswith(_SPEC_PREFIX))
            raise KnobError(f"unknown variable {name}; the speculative knobs are: {known}")

    def get(name: str, parse, default):
        raw = env.get(name)
        return default if raw is None else parse(name, raw)

    spec = SpecKnobs(
        max_batch=get("PEGAINFER_SPEC_MAX_BATCH", parse_count, 0),
        max_drafts=get("PEGAINFER_SPEC_MAX_DRAFTS", parse_count, 0),
        hedge=get("PEGAINFER_SPEC_HEDGE", parse_count, 0),
        hedge_positions=get("PEGAINFER_SPEC_HEDGE_POSITIONS", parse_counts, ()),
        hedge_auto=get("PEGAINFER_SPEC_HEDGE_AUTO", parse_flag, False),
        hedge_knee=get("PEGAINFER_SPEC_HEDGE_KNEE", parse_count, 0),
    )
    return Knobs(spec=spec, test_log=get("PEGAINFER_TEST_LOG", parse_flag, False))


# -- Gate, test and path variables: read by gates/, engine/provenance.py and the fixture cache --------

GATE_KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("PEGASPEC_CACHE", "path", "fixture cache root (default: ~/.cache/pegaspec/fixtures)"),
        Knob("PEGASPEC_COMMIT", "path", "the commit a device copy of the tree was shipped at (wins over git)"),
    )
}


@dataclass(frozen=True)
class GateKnobs:
    """Unset or blank paths are None; flags are 0/1 like every other flag."""

    target: str | None = None  # PEGAINFER_TEST_MODEL_PATH
    drafter: str | None = None  # PEGAINFER_DFLASH_TEST_MODEL_PATH
    hedge_drafter: str | None = None  # PEGAINFER_TEST_HEDGE_DRAFTER
    require_gate: bool = False  # PEGAINFER_REQUIRE_SPEC_GATE
    batch_invariant: bool = False  # PEGAINFER_TEST_BATCH_INVARIANT
    test_log: bool = False  # PEGAINFER_TEST_LOG
    run_record: str | None = None  # PEGAINFER_RUN_RECORD
    cache: str | None = None  # PEGASPEC_CACHE
    commit: str | None = None  # PEGASPEC_COMMIT


def parse_path(name: str, raw: str) -> str | None:
    """A path or hub id: any UTF-8 text without NUL; blank means unset."""
    text = _text(name, raw)
    if "\0" in text:
        raise KnobError(f"{name}={text!r} holds a NUL byte; expected a path")
    return text.strip() or None


def read_gate_knobs(environ: Mapping[str, str] | None = None) -> GateKnobs:
    """Validate the gate, test and path variables in `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ

    def get(name: str, parse, default):
        raw = env.get(name)
        return default if raw is None else parse(name, raw)

    return GateKnobs(
        target=get("PEGAINFER_TEST_MODEL_PATH", parse_path, None),
        drafter=get("PEGAINFER_DFLASH_TEST_MODEL_PATH", parse_path, None),
        hedge_drafter=get("PEGAINFER_TEST_HEDGE_DRAFTER", parse_path, None),
        require_gate=get("PEGAINFER_REQUIRE_SPEC_GATE", parse_flag, False),
        batch_invariant=get("PEGAINFER_TEST_BATCH_INVARIANT", parse_flag, False),
        test_log=get("PEGAINFER_TEST_LOG", parse_flag, False),
        run_record=get("PEGAINFER_RUN_RECORD", parse_path, None),
        cache=get("PEGASPEC_CACHE", parse_path, None),
        commit=get("PEGASPEC_COMMIT", parse_path, None),
    )
