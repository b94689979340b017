"""Every PEGAINFER_* environment variable: declared once, parsed and validated in one place.

Read once, at the engine's one start path, before any weight is read. A malformed value refuses
to start with an error naming the variable and showing the value; unset and `0` mean off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.levers import CHOICES, ENV_PREFIX, MAX_COUNT, Levers, env_name, lever_doc, lever_kind, lever_names

_COUNT = re.compile(r"\+?[0-9]+", re.ASCII)


class KnobError(ValueError):
    """A PEGAINFER_* variable with a value the engine refuses to start with."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "count", "counts" (comma-separated), "flag" (0/1), "choice" (a name), "path"
    doc: str


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        *(Knob(env_name(name), lever_kind(name), lever_doc(name)) for name in lever_names()),
        Knob(
            "PEGAINFER_SPEC_COST_TABLE",
            "path",
            "the adaptive policy's cost table: an `engine.bench profile` CSV (verify and draft ms per batch); "
            "unset: the engine calibrates one at start and caches it under PEGASPEC_CACHE",
        ),
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
    if value > MAX_COUNT:
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


def parse_choice(label: str, raw: str, allowed: tuple[str, ...]) -> str:
    text = _text(label, raw).strip()
    if text not in allowed:
        raise KnobError(f"{label}={raw!r} is not one of {'|'.join(allowed)}; refusing to start")
    return text


def parse_lever(name: str, raw: str, label: str | None = None) -> object:
    """A lever's text form (environment or CLI flag) -> its value; `label` names the source in errors."""
    kind = lever_kind(name)
    if kind == "choice":
        return parse_choice(label or env_name(name), raw, CHOICES[name])
    parse = {"count": parse_count, "counts": parse_counts, "flag": parse_flag}[kind]
    return parse(label or env_name(name), raw)


@dataclass(frozen=True)
class Knobs:
    levers: Levers = field(default_factory=Levers)
    test_log: bool = False
    cost_table: str | None = None  # PEGAINFER_SPEC_COST_TABLE


def read_knobs(environ: Mapping[str, str] | None = None) -> Knobs:
    """Validate every PEGAINFER_SPEC_* variable in `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in KNOBS:
            known = ", ".join(k for k in KNOBS if k.startswith(ENV_PREFIX))
            raise KnobError(f"unknown variable {name}; the speculative knobs are: {known}")
    levers = Levers(**{n: parse_lever(n, env[env_name(n)]) for n in lever_names() if env_name(n) in env})
    raw_log, raw_table = env.get("PEGAINFER_TEST_LOG"), env.get("PEGAINFER_SPEC_COST_TABLE")
    return Knobs(
        levers,
        test_log=raw_log is not None and parse_flag("PEGAINFER_TEST_LOG", raw_log),
        cost_table=None if raw_table is None else parse_path("PEGAINFER_SPEC_COST_TABLE", raw_table),
    )


# -- Gate, test and path variables: read by gates/, engine/provenance.py and the fixture cache --------

GATE_KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "PEGASPEC_CACHE",
            "path",
            "cache root: fixture builds (default ~/.cache/pegaspec/fixtures) and calibrated cost tables in "
            "<root>/costs (default ~/.cache/pegaspec/costs)",
        ),
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
        return default if name not in env else parse(name, env[name])

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
