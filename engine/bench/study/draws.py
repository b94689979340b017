"""The modelled drafter's own draws, read before the sweep, for the cost model's replay (why: the
benchmarks README, "study"). Inputs of the study, not measurements.

draws.npz: per (profile, replica) a uint8 array [prompts, new_tokens], entry [p, j] the drafts the
drafter gets right for prompt p at KV length len(prompt p) + j; `total` is the sweep's prompt count
(closed_loop takes prompt (first + i) % total for request i). `python -m engine.bench study-files
--rebuild-draws DIR` rebuilds them on the study's GPU type; replay_check tests them against the sweep."""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from engine.bench.arms import Arm, arm_drafts, parse_arm, parse_arms
from engine.bench.common import make_engine, resolve_device, setup_logging, torch_dtype
from engine.bench.study.sim import Accepted, simulate_closed_loop
from engine.fixture.known.modelled import AcceptanceProfile, ModelledDrafter, parse_profile
from engine.fixture.known.target import known_pair
from engine.models.config import DFlashConfig
from engine.scheduler import Plan

log = logging.getLogger(__name__)

DRAWS_FILE = "draws.npz"


@dataclass
class StudyDraws:
    """counts[(profile, replica)]: [prompts, positions] accepted drafts; replicas: arm label -> replica."""

    counts: dict[tuple[str, int], np.ndarray]
    replicas: dict[str, int]
    total: int  # prompts in the sweep's list

    def accepted(self, profile: str, label: str, first: int) -> Accepted | None:
        """The draws of one arm-run whose requests take prompts first, first + 1, ... (None: unknown)."""
        table = self.counts.get((profile, self.replicas.get(label, 0)))
        if table is None:
            return None
        rows, positions = table.shape

        def draw(index: int, generated: int) -> int:
            p, j = (first + index) % self.total, generated - 1  # KV length: prompt + output - 1
            if p >= rows or not 0 <= j < positions:
                raise ValueError(f"draws: prompt {p}, position {j} outside the table ({rows} x {positions})")
            return int(table[p, j])

        return draw

    def save(self, out: Path) -> None:
        keys = sorted(self.counts)
        labels = sorted(self.replicas)
        np.savez_compressed(
            out / DRAWS_FILE,
            total=np.array(self.total),
            profiles=np.array([profile for profile, _ in keys]),
            tables=np.array([replica for _, replica in keys], dtype=np.int64),
            labels=np.array(labels),
            replicas=np.array([self.replicas[a] for a in labels], dtype=np.int64),
            **{f"counts{i}": self.counts[key] for i, key in enumerate(keys)},
        )

    @classmethod
    def load(cls, directory: Path) -> StudyDraws | None:
        """The study's draws, or None where the run predates them (the replay then draws its own)."""
        path = directory / DRAWS_FILE
        if not path.is_file():
            return None
        with np.load(path) as f:
            keys = zip(f["profiles"].tolist(), f["tables"].tolist(), strict=True)
            counts = {(profile, replica): f[f"counts{i}"] for i, (profile, replica) in enumerate(keys)}
            replicas = dict(zip(f["labels"].tolist(), f["replicas"].tolist(), strict=True))
            return cls(counts, replicas, int(f["total"]))


def sweep_prompts(concurrency: Sequence[int], rounds: int, waves_for, total: int) -> int:
    """Prompts the sweep's rounds (warm-up included) can reach: round r of c starts at r x waves x c."""
    return min(total, max((rounds + 1) * waves_for(c) * c for c in concurrency))


def read_draws(
    drafter: ModelledDrafter,
    prompts: Sequence[Sequence[int]],
    profiles: Sequence[AcceptanceProfile],
    arms: Sequence[Arm],
    new_tokens: int,
    count: int,
) -> StudyDraws:
    """The drafter's draws for the first `count` prompts at every KV length a request reaches, per
    profile and per replica an arm draws from (its own method, on its device); its profile and
    replica are put back to the first profile's and 0."""
    device = drafter.device
    lengths = torch.tensor([len(p) for p in prompts[:count]], device=device)
    token = torch.tensor([p[-1] for p in prompts[:count]], device=device)[:, None].expand(-1, new_tokens)
    num_kv = lengths[:, None] + torch.arange(new_tokens, device=device)[None, :]
    replicas = {}
    for arm in arms:
        if not arm.is_plain:
            drafter.before_arm(arm)
            replicas[arm.label] = drafter.replica
    counts = {}
    try:
        for profile in profiles:
            drafter.set_profile(profile)
            for replica in sorted(set(replicas.values())):
                drafter.set_replica(replica)
                got = drafter.accepted(token.reshape(-1), num_kv.reshape(-1)).view(count, new_tokens)
                counts[(profile.name, replica)] = got.to(torch.uint8).cpu().numpy()
    finally:
        drafter.set_profile(profiles[0])
        drafter.set_replica(0)
    log.info("draws: %d prompts x %d positions, %d tables", count, new_tokens, len(counts))
    return StudyDraws(counts, replicas, len(prompts))


def draws_stage(drafter: ModelledDrafter, prompts, profiles, arms, args, waves_for) -> StudyDraws | None:
    """read_draws for the study's sweep, written to draws.npz; None (logged) if that fails: the
    predictions then replay seeded draws from the profile."""
    count = sweep_prompts(args.concurrency, args.rounds, waves_for, len(prompts))
    try:
        draws = read_draws(drafter, prompts, profiles, arms, args.new_tokens, count)
        draws.save(args.out)
    except Exception:
        log.exception("reading the modelled drafter's draws failed: predictions replay seeded draws")
        return None
    return draws


def rebuild_draws(directory: Path, parser: argparse.ArgumentParser, prompts_for, waves_for) -> Path:
    """A study's draws.npz from its meta.json: its arguments parsed by the study's own `parser`, its
    prompts from `prompts_for(args, vocab)` (engine/bench/study.py passes these in: this module stays
    below it)."""
    meta = json.loads((directory / "meta.json").read_text())
    args = parser.parse_args([*meta["argv"], "--out", str(directory)])
    setup_logging(args.verbose)
    device = resolve_device(args.device)
    target, drafter = known_pair(args.geometry, device, torch_dtype(args.dtype, device), args.seed)
    per_round = DFlashConfig.from_dict(drafter.config).drafts_per_round
    engine = make_engine(target, drafter, args, device, max_num_seqs=1, seq_tokens=64, headroom=per_round + 1)
    profiles = [parse_profile(name).first(per_round) for name in args.profiles]
    prompts = prompts_for(args, engine.target_cfg.geometry.vocab_size)
    modelled = ModelledDrafter(engine, profiles[0], seed=args.seed)
    arms = parse_arms(args.arms, noise_arm=True, spec_noise_arm=True)
    count = sweep_prompts(args.concurrency, args.rounds, waves_for, len(prompts))
    read_draws(modelled, prompts, profiles, arms, args.new_tokens, count).save(directory)
    return directory / DRAWS_FILE


_FREE = SimpleNamespace(prefill_ms=lambda *_: 0.0, step_ms=lambda *_: 0.0)  # a static arm's steps: not their costs


def replay_check(
    rows: Sequence[dict], profile: AcceptanceProfile, args, waves_for, draws: StudyDraws
) -> tuple[int, int]:
    """(runs whose replay on the drafter's own draws took the engine's prefill, speculative and gated
    step counts, runs replayed): the draws are applied as the engine applies them. Static speculative
    arms only: the adaptive policy decides on the engine's own walls."""
    same = total = 0
    for r in rows:
        arm, c = parse_arm(r["arm"]), r["concurrency"]
        drafts = arm_drafts(arm, len(profile.conditional))
        accepted = draws.accepted(profile.name, arm.label, r["round"] * waves_for(c) * c)
        if drafts is None or arm.adaptive or accepted is None:
            continue
        try:
            res = simulate_closed_loop(
                _FREE, c, waves_for(c) * c, args.new_tokens, drafts, gate=arm.gate, accepted=accepted
            )
        except ValueError:  # a run past the stored draws (read_draws: the prompts the sweep reaches)
            continue
        plans = Counter(plan for plan, _ in res.steps)
        total += 1
        replayed = (plans[Plan.PREFILL.value], plans[Plan.SPECULATIVE.value], plans[Plan.GATED.value])
        same += replayed == (r["prefill_steps"], r["spec_steps"], r["gated_steps"])
    return same, total
