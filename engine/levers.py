"""The speculative path's load levers: one frozen type, declared once, validated once, whatever the source
(docs/architecture.md, "Levers and knobs"). A field's type decides its text parser: an int a count, a tuple
comma-separated counts, a bool a 0/1 flag, a str one of CHOICES[name]; 0 (and ()) mean off."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

MAX_COUNT = 2**64 - 1
ENV_PREFIX = "PEGAINFER_SPEC_"
CHOICES: dict[str, tuple[str, ...]] = {"policy": ("static", "adaptive", "budget")}  # the first is the default


class LeverError(ValueError):
    """A lever value the engine refuses to start (or switch) with."""


def _lever(default: object, doc: str):
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Levers:
    max_batch: int = _lever(0, "load gate: while the active batch is >= n, verify one token (a gated round)")
    max_drafts: int = _lever(0, "static trim: only the first k drafts enter the verify span")
    hedge: int = _lever(0, "hedged verify: extra chains for up to h greedy requests a round")
    hedge_positions: tuple[int, ...] = _lever((), "draft positions where hedge chains branch, e.g. 0,1,2")
    hedge_auto: bool = _lever(False, "the auto-hedge controller picks the chain count from measured tok/s")
    hedge_knee: int = _lever(0, "verify rows the forward takes nearly free; hedging stays under it")
    policy: str = _lever(
        "static", "span policy: static (the levers alone), adaptive (K per round from cost), budget (K per request)"
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_value(f.name, getattr(self, f.name))

    def replace(self, changes: Mapping[str, object]) -> Levers:
        """These levers with `changes` (field name -> value; None keeps the current value)."""
        unknown = sorted(set(changes) - set(lever_names()))
        if unknown:
            raise LeverError(f"unknown lever(s) {unknown}; the levers are {lever_names()}")
        given = {k: tuple(v) if k == "hedge_positions" and isinstance(v, list) else v for k, v in changes.items()}
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


def gated(batch: int, max_batch: int) -> bool:
    """MAX_BATCH's rule, the one place it is written: gated while the batch is at or above it (0 = off)."""
    return bool(max_batch) and batch >= max_batch


def lever_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Levers)]


def lever_doc(name: str) -> str:
    return Levers.__dataclass_fields__[name].metadata["doc"]


def lever_kind(name: str) -> str:
    """'count', 'counts', 'flag' or 'choice': how the lever's text form is parsed."""
    default = Levers.__dataclass_fields__[name].default
    if isinstance(default, str):
        return "choice"
    return "flag" if isinstance(default, bool) else "counts" if isinstance(default, tuple) else "count"


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def check_value(name: str, value: object) -> None:
    choices = CHOICES.get(name, ())
    ok, want = {
        "choice": (value in choices, "one of " + "|".join(choices)),
        "flag": (isinstance(value, bool), "a bool"),
        "counts": (isinstance(value, tuple) and all(_is_count(p) for p in value), "a sequence of ints >= 0"),
        "count": (_is_count(value), "an int >= 0 (0 = off)"),
    }[lever_kind(name)]
    if not ok:
        raise LeverError(f"lever {name}={value!r}; expected {want}")
