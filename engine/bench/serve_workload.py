"""What serve-load serves: each arm's server command, the prompts, the drafter's KV headroom and what
the record says about the weights. A pair of directories (or a recipe) runs `python -m engine serve`;
the bench-only known-continuation pair runs `python -m engine.bench serve-pair`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.bench.arms import Arm
from engine.bench.common import drafter_block, load_prompts, resolve_device, weights_of
from engine.fixture.known.geometry import drafter_config, random_prompts, target_config
from engine.fixture.known.modelled import parse_profile
from engine.models.config import DFlashConfig

Command = Callable[[Arm], list[str]]
Workload = tuple[Command, list[list[int]], int, dict]


def engine_command(arm: Arm, target: Path, drafter: Path | None) -> list[str]:
    """`python -m engine serve` of one arm: plain has no drafter; a spec arm's levers are all flags."""
    cmd = [sys.executable, "-m", "engine", "serve", "--model", str(target)]
    if not arm.is_plain:
        cmd += ["--draft-model", str(drafter)]
        for name, value in arm.levers().items():
            cmd += ["--" + name.replace("_", "-"), str(value)]
    return cmd


def pair_command(arm: Arm, geometry: str, profile: str) -> list[str]:
    """The bench-only known-continuation pair (engine/bench/serve_pair.py) of one arm."""
    cmd = [sys.executable, "-m", "engine.bench", "serve-pair", "--geometry", geometry, "--profile", profile]
    return cmd + ["--arm", arm.label]


def known_workload(args: argparse.Namespace) -> Workload:
    """The known pair's server command per arm, random token-id prompts, the drafter's KV headroom and
    what the record says about the weights (the pair has no vocabulary, no prompt set, no files)."""
    if args.target or args.drafter or args.recipe or args.prompts or args.max_prompt_len:
        raise SystemExit("--geometry serves the bench-only known pair: leave out --target/--drafter/--recipe/--prompts")
    try:
        profile = parse_profile(args.profile)
    except ValueError as err:
        raise SystemExit(f"--profile: {err}") from None
    if args.prompt_len < 1 or args.num_prompts < 1:
        raise SystemExit("--prompt-len and --num-prompts must be >= 1")
    vocab = target_config(args.geometry)["vocab_size"]
    prompts = random_prompts(args.num_prompts, args.prompt_len, vocab, seed=1)
    meta = dict(
        target=f"known-{args.geometry} (bench-only: greedy output repeats the last prompt token)",
        drafter=f"random {args.geometry} DFlash forward, drafts modelled by the {profile.name} profile",
        prompts=f"{args.num_prompts} random token-id prompts of {args.prompt_len}",
        modelled="where the first wrong draft falls; real: every forward, every byte, the verification",
    )
    headroom = DFlashConfig.from_dict(drafter_config(args.geometry)).block_size
    return (lambda arm: pair_command(arm, args.geometry, args.profile)), prompts, headroom, meta


def file_workload(args: argparse.Namespace, arms: Sequence[Arm]) -> Workload:
    """A target/drafter pair of directories (or a recipe) served by `python -m engine serve`."""
    target, drafter, prompt_path = weights_of(args, resolve_device(args.device), arms)
    prompts = load_prompts(prompt_path, target, args.max_prompt_len)
    headroom = drafter_block(drafter) if drafter is not None else 0
    meta = dict(target=str(target), drafter=str(drafter), prompts=str(prompt_path))
    return (lambda arm: engine_command(arm, target, drafter)), prompts, headroom, meta
