"""Bench-only: a modelled drafter for the known-continuation target (engine/bench/known_pair.py).

The real drafter forward runs every round (its cost is real); its proposals are then overwritten in
place by the known continuation (the current token repeated), with the first wrong token placed by a
seeded per-position conditional acceptance model whose draws every arm shares. The target still
verifies every round, so what is modelled is only where the first wrong draft falls. Nothing on the
serving path reaches it (SPEC 9).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

POSITIONS = 15  # the profiles' span: the z-lab block-16 drafter's 15 drafts
LINEAR = {"code": (0.87, 0.78), "chat": (0.72, 0.63)}  # conditional acceptance at position 1 and 15
MEASURED = "measured:"


@dataclass(frozen=True)
class AcceptanceProfile:
    """conditional[i]: P(draft i+1 accepted | drafts 1..i accepted)."""

    name: str
    conditional: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.conditional or any(not 0.0 <= a <= 1.0 for a in self.conditional):
            raise ValueError(f"profile {self.name!r}: conditional acceptance must be in [0, 1], got {self.conditional}")

    def unconditional(self) -> list[float]:
        """P(more than i drafts accepted), i = 0..: the running product of the conditionals."""
        out, p = [], 1.0
        for a in self.conditional:
            p *= a
            out.append(p)
        return out

    def first(self, drafts: int) -> AcceptanceProfile:
        if drafts > len(self.conditional):
            raise ValueError(f"profile {self.name!r} covers {len(self.conditional)} positions, not {drafts}")
        return AcceptanceProfile(self.name, self.conditional[:drafts])


def linear_profile(name: str, first: float, last: float, positions: int = POSITIONS) -> AcceptanceProfile:
    step = (last - first) / (positions - 1)
    return AcceptanceProfile(name, tuple(round(first + step * i, 6) for i in range(positions)))


def measured_profile(path: Path) -> AcceptanceProfile:
    """Conditionals from a fixture pair's eval (manifest.json, or the pair directory holding it):
    eval.acceptance_by_position[i] is the share of rounds that accepted more than i drafts."""
    path = Path(path)
    manifest = path / "manifest.json" if path.is_dir() else path
    if not manifest.is_file():
        raise ValueError(f"{MEASURED}{path}: no manifest ({manifest} does not exist)")
    try:
        by_pos = json.loads(manifest.read_text())["eval"]["acceptance_by_position"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{manifest}: no eval.acceptance_by_position ({err!r})") from None
    if not by_pos or any(not isinstance(v, int | float) or not 0 <= v <= 1 for v in by_pos):
        raise ValueError(f"{manifest}: eval.acceptance_by_position must be shares in [0, 1], got {by_pos!r}")
    cond, prev = [], 1.0
    for u in by_pos:
        cond.append(min(1.0, u / prev) if prev > 0 else 0.0)
        prev = u
    return AcceptanceProfile(f"{MEASURED}{manifest.parent.name}", tuple(cond))


def parse_profile(spec: str) -> AcceptanceProfile:
    """`code`, `chat` or `measured:<pair dir or manifest.json>`; a ValueError names a bad one."""
    if spec in LINEAR:
        return linear_profile(spec, *LINEAR[spec])
    if spec.startswith(MEASURED) and len(spec) > len(MEASURED):
        return measured_profile(Path(spec[len(MEASURED) :]))
    raise ValueError(f"acceptance profile {spec!r}: expected one of {', '.join(LINEAR)} or {MEASURED}<pair>")


class ModelledDrafter:
    """Wraps one engine instance's runner.draft: the real forward, then its [N, D] drafts rewritten in
    place (under CUDA graphs the verify graph reads the draft graph's own output buffer) as the current
    token repeated, except token ^ 1 (never the current token) at the first wrong position n: the number
    of leading positions whose uniform falls under the profile.

    The uniforms are shared between arms (common random numbers): a request-round's row of the table
    is keyed on its current token (the known target's echo: its prompt's last token) and its KV length,
    so two arms that reach one position of one prompt draw the same acceptance there, and an arm that
    takes K = 15 sees what `spec` sees (drawn from one stream in turn, the H200 study's adaptive arm at
    K = 15 measured a τ 8 % under `spec`'s by chance). `replica` salts the key: a duplicate arm
    (`spec#2`) draws apart, so its noise floor keeps the acceptance's spread over prompts."""

    def __init__(self, engine, profile: AcceptanceProfile, seed: int = 0, rows: int = 1 << 18):
        vocab = engine.target_cfg.geometry.vocab_size
        if vocab % 2:
            raise ValueError(f"the modelled drafter's wrong token is token ^ 1: needs an even vocabulary, not {vocab}")
        if engine.drafter is None:
            raise ValueError("the modelled drafter wraps a speculative engine (it has no drafter)")
        if rows & (rows - 1):
            raise ValueError(f"rows must be a power of two, not {rows}")
        self.runner, self.drafts = engine.runner, engine.drafts_per_round
        self.device, self.rows = engine.device, rows
        self._real = engine.runner.draft
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self._table = torch.rand(rows, self.drafts, generator=gen, device=self.device)
        self._positions = torch.arange(self.drafts, device=self.device)
        self.request_rounds, self.replica = 0, 0
        self.set_profile(profile)

    def set_profile(self, profile: AcceptanceProfile) -> None:
        self.profile = profile.first(self.drafts)
        self._cond = torch.tensor(self.profile.conditional, dtype=torch.float32, device=self.device)

    def set_replica(self, replica: int) -> None:
        """0 for every primary arm; 1, 2 ... for the duplicates, which draw apart."""
        self.replica = replica

    def before_arm(self, arm) -> None:
        """A sweep's hook: an arm tagged `#word` (a duplicate, e.g. `spec#2`) draws apart by its tag."""
        _, _, tag = arm.label.partition("#")
        self.set_replica(1 + zlib.crc32(tag.encode()) % 65521 if tag else 0)

    def accepted(self, token: torch.Tensor, num_kv: torch.Tensor) -> torch.Tensor:
        """[N] leading accepted positions of request-rounds at these current tokens and KV lengths."""
        key = token * 0x9E3779B1 + num_kv * 0x85EBCA77 + self.replica * 0xC2B2AE3D  # odd: each KV step a new row
        u = self._table[key & (self.rows - 1)]
        return (u < self._cond).to(torch.int64).cumprod(1).sum(1)

    def draft(self, reqs: Sequence, heads: int | None = None) -> torch.Tensor:
        drafts = self._real(reqs, heads)
        n, d = drafts.shape
        token = self.runner.field("token", n)
        self.request_rounds += n
        wrong = self._positions[None, :d] == self.accepted(token, self.runner.field("num_kv", n))[:, None]
        torch.bitwise_xor(token[:, None], wrong, out=drafts)
        return drafts

    def install(self) -> ModelledDrafter:
        self.runner.draft = self.draft
        return self

    def uninstall(self) -> None:
        if self.runner.__dict__.get("draft") == self.draft:
            del self.runner.draft
