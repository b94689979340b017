"""Every PEGAINFER_* and PEGASPEC_* environment variable, declared as a field of Knobs or GateKnobs (name and
parser in its metadata) and read once, at the engine's one start path, before any weight is read. A malformed
value refuses to start with an error naming the variable and showing the value; unset and `0` mean off."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from engine.levers import CHOICES, ENV_PREFIX, MAX_COUNT, Levers, env_name, lever_kind, lever_names

_COUNT = re.compile(r"\+?[0-9]+", re.ASCII)


class KnobError(ValueError):
    """A PEGAINFER_* variable with a value the engine refuses to start with."""


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


def parse_path(name: str, raw: str) -> str | None:
    """A path or hub id: any UTF-8 text without NUL; blank means unset."""
    text = _text(name, raw)
    if "\0" in text:
        raise KnobError(f"{name}={text!r} holds a NUL byte; expected a path")
    return text.strip() or None


def parse_lever(name: str, raw: str, label: str | None = None) -> object:
    """A lever's text form (environment or CLI flag) -> its value; `label` names the source in errors."""
    kind, label = lever_kind(name), label or env_name(name)
    if kind != "choice":
        return {"count": parse_count, "counts": parse_counts, "flag": parse_flag}[kind](label, raw)
    text = _text(label, raw).strip()
    if text not in CHOICES[name]:
        raise KnobError(f"{label}={raw!r} is not one of {'|'.join(CHOICES[name])}; refusing to start")
    return text


def _knob(var: str, parse: Callable[[str, str], object], default: object = None):
    return field(default=default, metadata={"var": var, "parse": parse})


def _read(cls: type, environ: Mapping[str, str] | None, **given: object):
    """cls with each variable declared in its fields' metadata parsed from `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    for f in dataclasses.fields(cls):
        var = f.metadata.get("var")
        if var is not None and var in env:
            given[f.name] = f.metadata["parse"](var, env[var])
    return cls(**given)


TEST_LOG = ("PEGAINFER_TEST_LOG", parse_flag)  # per-round trace lines on stderr; read by the engine and gates


@dataclass(frozen=True)
class Knobs:
    levers: Levers = field(default_factory=Levers)  # PEGAINFER_SPEC_<LEVER>, engine/levers.py
    test_log: bool = _knob(*TEST_LOG, False)
    # The adaptive policy's cost table: an `engine.bench profile` CSV (verify and draft ms per batch);
    # unset: the engine calibrates one at start and caches it under PEGASPEC_CACHE.
    cost_table: str | None = _knob("PEGAINFER_SPEC_COST_TABLE", parse_path)


# Every PEGAINFER_SPEC_* variable: one per lever, plus the engine knobs with the prefix.
SPEC_VARS = (
    *(env_name(n) for n in lever_names()),
    *(f.metadata["var"] for f in dataclasses.fields(Knobs) if f.metadata.get("var", "").startswith(ENV_PREFIX)),
)


def read_knobs(environ: Mapping[str, str] | None = None) -> Knobs:
    """Validate every PEGAINFER_SPEC_* variable in `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in SPEC_VARS:
            raise KnobError(f"unknown variable {name}; the speculative knobs are: {', '.join(SPEC_VARS)}")
    levers = Levers(**{n: parse_lever(n, env[env_name(n)]) for n in lever_names() if env_name(n) in env})
    return _read(Knobs, env, levers=levers)


@dataclass(frozen=True)
class GateKnobs:
    """The gate, test and path variables (gates/, engine/provenance.py, the fixture cache)."""

    target: str | None = _knob("PEGAINFER_TEST_MODEL_PATH", parse_path)  # gate target weights (default: shipped pair)
    drafter: str | None = _knob("PEGAINFER_DFLASH_TEST_MODEL_PATH", parse_path)  # gate drafter weights, likewise
    # A Markov-head (DSpark) drafter for the hedge gate case; the lossless children use it in place of the
    # pair's drafter (default for the fixture pair: its drafter-dspark).
    hedge_drafter: str | None = _knob("PEGAINFER_TEST_HEDGE_DRAFTER", parse_path)
    require_gate: bool = _knob("PEGAINFER_REQUIRE_SPEC_GATE", parse_flag, False)  # every gate skip fails instead
    # Gates run batch-invariant numerics and excuse no divergence.
    batch_invariant: bool = _knob("PEGAINFER_TEST_BATCH_INVARIANT", parse_flag, False)
    test_log: bool = _knob(*TEST_LOG, False)
    run_record: str | None = _knob("PEGAINFER_RUN_RECORD", parse_path)  # where the gate session writes its record
    # Cache root: fixture builds (default ~/.cache/pegaspec/fixtures) and calibrated cost tables in <root>/costs
    # (default ~/.cache/pegaspec/costs).
    cache: str | None = _knob("PEGASPEC_CACHE", parse_path)
    # The commit a device copy of the tree was shipped at (wins over git).
    commit: str | None = _knob("PEGASPEC_COMMIT", parse_path)


def read_gate_knobs(environ: Mapping[str, str] | None = None) -> GateKnobs:
    """Validate the gate, test and path variables in `environ` (default: os.environ)."""
    return _read(GateKnobs, environ)
