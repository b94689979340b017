"""The near-tie rule of the lossless check: when may an emitted token differ from the target's argmax?

Only where the engine's own numerics can explain the flip. At such a position the target is evaluated
again in float32 through the torch reference path (the same weights, upcast); the token is excused when
its fp32 logit is behind the fp32 top one by no more than the bound: twice the largest logit error the
engine's forward makes at that very position against the fp32 evaluation (an error of that size on both
logits can swap them). A wrong token is several logits behind and fails; an fp32 engine on the torch path
is its own reference (bound 0), so nothing there can be excused; under batch-invariant numerics the
check excuses nothing at all (gates/lossless.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# What a reference evaluates: fp32 logits [V] of the next token after these ids.
Logits = Callable[[Sequence[int]], torch.Tensor]


@dataclass(frozen=True)
class Excuse:
    """One excused position: the emitted token, the fp32 top token, the fp32 gap between them and
    the bound it sits under (logits)."""

    position: int
    token: int
    top: int
    gap: float
    bound: float

    @property
    def holds(self) -> bool:
        return self.gap <= self.bound

    def line(self, test: str, request: str) -> str:
        """The line the gate reads (trace_tools.excused_lines) and lists in the run record."""
        return (
            f"[excused] test={test} request={request} position={self.position} token={self.token} top={self.top} "
            f"gap={self.gap:.9g} bound={self.bound:.9g}"
        )


class Fp32Reference:
    """The target's fp32 logits through the torch reference path, its engine built on first use.

    engine: the engine under check (its `last_logits` are what the check compared); build: makes
    the fp32 torch engine (default: the engine's own checkpoint at float32, the torch backend)."""

    def __init__(self, engine, build: Callable[[], object] | None = None):
        self.engine, self._build, self._ref = engine, build, None

    @property
    def is_engine(self) -> bool:
        """The engine is already fp32 on the torch path: it is its own reference."""
        return getattr(self.engine, "dtype", None) == torch.float32 and self.engine.ops.name == "torch"

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        if self.is_engine:
            return self.engine.last_logits(ids)
        if self._ref is None:
            self._ref = (self._build or self._default)()
        return self._ref.last_logits(ids)

    def _default(self):
        from engine import Engine, EngineConfig  # a stand-in target in the unit tests needs no engine

        cfg = self.engine.config
        return Engine(
            EngineConfig(
                model=cfg.model,
                device=self.engine.device.type,
                dtype="float32",
                backend="torch",
                cuda_graphs=False,
                max_num_seqs=1,
                max_model_len=self.engine.max_model_len,
                trace=False,
            )
        )


_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reference_for(engine) -> Fp32Reference:
    """One reference per engine (a child checks many outputs against one plain engine)."""
    ref = _REFERENCES.get(engine)
    if ref is None:
        ref = _REFERENCES[engine] = Fp32Reference(engine)
    return ref


def judge(
    reference: Fp32Reference, ids: Sequence[int], engine_logits: torch.Tensor, token: int, position: int
) -> Excuse:
    """The case for emitting `token` (output position `position`) after `ids`, where the engine's logits
    there pick another: its fp32 gap and bound. It is excused only when it holds (gap <= bound)."""
    ref = reference.logits(ids).float()
    top = int(ref.argmax())
    gap = float(ref[top] - ref[token])
    bound = 2.0 * float((engine_logits.float() - ref).abs().max())
    return Excuse(position, token, top, gap, bound)
