"""Lever arms: `plain`, `spec`, `spec+trim=K`, `spec+gate=N`, `spec+trim=K+gate=N`, `spec+policy=adaptive`
(the adaptive span policy) or `spec+policy=budget` (K per request; trim and gate bound both), each
optionally tagged `#2` for a duplicate (the noise arm). Arms switch the levers of one speculative engine."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.levers import CHOICES

PLAIN, SPEC = "plain", "spec"
NOISE_ARM = "plain#2"
SPEC_NOISE_ARM = "spec#2"  # the speculative arms' own noise floor (acceptance varies with the prompts)
ADAPTIVE_ARM = "spec+policy=adaptive"
_OPTION = re.compile(r"^(trim|gate)=([0-9]+)$")


@dataclass(frozen=True)
class Arm:
    label: str  # as written, the key of every table row
    kind: str  # plain | spec
    trim: int = 0  # max_drafts (0 = the drafter's whole block)
    gate: int = 0  # max_batch (0 = off)
    policy: str = "static"  # the span policy lever

    @property
    def is_plain(self) -> bool:
        return self.kind == PLAIN

    @property
    def adaptive(self) -> bool:
        """Any span policy that decides per round (adaptive or budget): not a static K."""
        return self.policy != "static"

    @property
    def per_request(self) -> bool:
        return self.policy == "budget"

    def levers(self) -> dict[str, object]:
        """The lever values a speculative engine of this arm runs with ({} for plain), the hedge off,
        each explicit so PEGAINFER_SPEC_* cannot leak into an arm."""
        if self.is_plain:
            return {}
        return {"max_drafts": self.trim, "max_batch": self.gate, "hedge": 0, "policy": self.policy}


def arm_drafts(arm: Arm, per_round: int) -> int | None:
    """Drafts a speculative arm verifies per round (None for plain)."""
    if arm.is_plain:
        return None
    return min(arm.trim, per_round) if arm.trim else per_round


def parse_arm(spec: str) -> Arm:
    """One arm from its label; a ValueError names what is wrong with it."""
    text = spec.strip()
    body, _, tag = text.partition("#")
    if "#" in text and not re.fullmatch(r"[A-Za-z0-9_-]+", tag):
        raise ValueError(f"arm {spec!r}: the tag after '#' must be a non-empty word, e.g. plain#2")
    kind, *options = body.split("+")
    if kind not in (PLAIN, SPEC):
        raise ValueError(
            f"arm {spec!r}: unknown arm {kind!r}; expected plain, spec, spec+trim=K, spec+gate=N, {ADAPTIVE_ARM}"
        )
    if kind == PLAIN and options:
        raise ValueError(f"arm {spec!r}: plain takes no levers (trim/gate/policy apply to spec)")
    levers: dict[str, int] = {}
    policy = None
    for option in options:
        if option.startswith("policy="):
            if policy is not None:
                raise ValueError(f"arm {spec!r}: policy given twice")
            policy = option.partition("=")[2]
            if policy not in CHOICES["policy"]:
                raise ValueError(f"arm {spec!r}: policy={policy!r}; expected one of {'|'.join(CHOICES['policy'])}")
            continue
        m = _OPTION.match(option)
        if not m:
            raise ValueError(
                f"arm {spec!r}: bad lever {option!r}; expected trim=K or gate=N (>= 1) or policy=adaptive|budget"
            )
        name, value = m.group(1), int(m.group(2))
        if value < 1:
            raise ValueError(f"arm {spec!r}: {name}={value}; must be >= 1 (leave it out for off)")
        if name in levers:
            raise ValueError(f"arm {spec!r}: {name} given twice")
        levers[name] = value
    return Arm(text, kind, trim=levers.get("trim", 0), gate=levers.get("gate", 0), policy=policy or "static")


def parse_arms(specs: Sequence[str], noise_arm: bool = False, spec_noise_arm: bool = False) -> list[Arm]:
    """Arms in the given order; `plain` is added first when missing (every ratio is against it),
    `plain#2` last with noise_arm and `spec` + `spec#2` with spec_noise_arm. Duplicate labels are an error."""
    arms = [parse_arm(s) for s in specs]
    labels = [a.label for a in arms]
    if PLAIN not in labels:
        arms.insert(0, parse_arm(PLAIN))
    if noise_arm and NOISE_ARM not in labels:
        arms.append(parse_arm(NOISE_ARM))
    if spec_noise_arm:
        arms += [parse_arm(a) for a in (SPEC, SPEC_NOISE_ARM) if a not in labels]
    seen: set[str] = set()
    for a in arms:
        if a.label in seen:
            raise ValueError(f"arm {a.label!r} given twice; tag a duplicate, e.g. {a.label}#2")
        seen.add(a.label)
    return arms


def round_order(arms: Sequence[Arm], round_index: int) -> list[Arm]:
    """Round r runs every arm once, starting at arm r mod n, so no arm always runs first or after the
    same neighbour's warm caches."""
    k = round_index % len(arms)
    return list(arms[k:]) + list(arms[:k])


def verdict(ratio: float, noise_floor: float | None, bar: float = 0.0) -> str:
    """win / loss / parity of a median paired ratio vs plain: a claim no larger than the noise floor
    (or the minimum bar, whichever is larger) is parity."""
    threshold = max(noise_floor or 0.0, bar)
    if abs(ratio - 1.0) <= threshold + 1e-12:  # a claim exactly at the floor is no claim
        return "parity"
    return "win" if ratio > 1.0 else "loss"
