"""The lossless child on the known-continuation pair (bench-only, SPEC 9): the known target (every
greedy step repeats the last prompt token) and a DFlash drafter whose real forward runs every round
while the modelled drafter places its first wrong draft; the target still verifies every round.

    python -m gates.known_child [--geometry auto|4b|tiny|small] [--profile code|chat|code+weak] [--seed N]

The levers gate starts it like any other child: lever knobs (PEGAINFER_SPEC_*) and the trace
(PEGAINFER_TEST_LOG=1) come from its environment. It prints a `DFlash request` line per request, a
`[known]` line (the outputs against the known continuation) and a `[lossless]` line (every token
against the target's own choice), and exits 1 when either check fails. Nothing but this gate child
and the benches builds the pair; no knob selects it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Sequence
from functools import partial

import torch

from engine import Engine, EngineConfig
from engine.fixture.known.geometry import random_prompts
from engine.fixture.known.modelled import ModelledDrafter, parse_profiles
from engine.fixture.known.target import echo_failures, known_pair
from gates.devices import card_slot
from gates.lossless import Tally, batch_invariant, check, greedy, request_line
from gates.near_tie import Fp32Reference

log = logging.getLogger(__name__)

GEOMETRIES = ("auto", "4b", "tiny", "small")
# Staggered budgets, all submitted together: the batch shrinks mid-run. Under a MAX_BATCH=3 gate every
# round is gated up to token 56; the two longest requests then speculate 40 tokens more, enough rounds
# for both accepted and rejected drafts under any profile.
BUDGETS = (96, 24, 48, 40, 56, 16, 32, 96)
PROMPT_LEN = 16


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gates.known_child", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--geometry", default="auto", choices=GEOMETRIES, help="auto: 4b on a CUDA device, tiny shapes on CPU"
    )
    p.add_argument(
        "--profile",
        default="code",
        help="the modelled drafter's acceptance profile: code, chat; a+b: request i draws from the (i mod 2)-th",
    )
    p.add_argument("--seed", type=int, default=0, help="weights, prompts and the modelled acceptance draws")
    return p


def known_line(geometry: str, profile: str, requests: int, compared: int, mismatches: int, plain: int) -> str:
    """The line the gate reads (trace_tools.known_lines): outputs that left the known continuation."""
    return (
        f"[known] geometry={geometry} profile={profile} requests={requests} compared_tokens={compared} "
        f"mismatches={mismatches} plain_mismatches={plain}"
    )


def _engines(geometry: str, device: torch.device, seed: int) -> tuple[Engine, Engine]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, drafter = known_pair(geometry, device, dtype, seed)
    common = dict(
        model=target,
        device=device.type,
        batch_invariant=batch_invariant(),
        max_num_seqs=len(BUDGETS),
        max_model_len=PROMPT_LEN + max(BUDGETS) + 32,  # + the drafter's block headroom
    )
    engines = Engine(EngineConfig(**common)), Engine(EngineConfig(draft_model=drafter, **common))
    # Each engine holds its own fused copies (q|k|v, gate|up): drop the unfused originals, so the 4B
    # children of a multi-worker gate run fit on one card together.
    target.tensors.clear()
    drafter.tensors.clear()
    return engines


def _fp32_target(geometry: str, device: torch.device, seed: int) -> Engine:
    """The pair's target at float32 on the torch path (its engine weights, upcast): the near-tie
    rule's reference, built only if some output leaves the target's argmax."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, _ = known_pair(geometry, device, dtype, seed)
    target = dataclasses.replace(target, tensors={k: v.float() for k, v in target.tensors.items()})
    config = EngineConfig(
        model=target,
        device=device.type,
        dtype="float32",
        backend="torch",
        cuda_graphs=False,
        max_num_seqs=1,
        max_model_len=PROMPT_LEN + max(BUDGETS) + 32,
        trace=False,
    )
    return Engine(config)


def run(geometry: str, profile_name: str, seed: int) -> int:
    """Run the workload, print the child's lines; 0 when the outputs are the known continuation and
    every token is the target's own choice."""
    profiles = parse_profiles(profile_name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if geometry == "auto":
        geometry = "4b" if device.type == "cuda" else "tiny"
    with card_slot(device) if device.type == "cuda" and geometry == "4b" else contextlib.nullcontext():
        return _run(geometry, profile_name, profiles, device, seed)


def _run(geometry: str, profile_name: str, profiles, device: torch.device, seed: int) -> int:
    plain, spec = _engines(geometry, device, seed)
    ModelledDrafter(spec, profiles, seed=seed).install()
    prompts = random_prompts(len(BUDGETS), PROMPT_LEN, spec.target_cfg.geometry.vocab_size, seed + 1)
    c, vocab = len(profiles), spec.target_cfg.geometry.vocab_size
    for i, ids in enumerate(prompts):  # the last token (the known continuation) picks request i's profile
        ids[-1] = ids[-1] // c * c + i % c - (c if ids[-1] // c * c + i % c >= vocab else 0)
    params = [greedy(b) for b in BUDGETS]
    outs = spec.generate(prompts, params)
    got = [o.token_ids for o in outs]
    want = [o.token_ids for o in plain.generate(prompts, params)]
    for ids, budget, out in zip(prompts, BUDGETS, outs, strict=True):
        print(request_line(out.request_id, len(ids), len(out.token_ids), budget))
    wrong, plain_wrong = echo_failures(prompts, got), echo_failures(prompts, want)
    compared = sum(len(t) for t in got)
    print(known_line(geometry, profile_name, len(prompts), compared, len(wrong), len(plain_wrong)))
    for i, at in wrong:
        log.error("%s left the known continuation at output token %d", outs[i].request_id, at)
    tally, exact = Tally(), batch_invariant()
    reference = Fp32Reference(plain, partial(_fp32_target, geometry, device, seed))
    try:
        for ids, budget, w, g, out in zip(prompts, BUDGETS, want, got, outs, strict=True):
            check(plain, ids, w, g, tally, exact, budget, request=out.request_id, reference=reference)
        tally.report("known_continuation")
    except AssertionError as err:
        log.error("the lossless check failed: %s", err)
        return 1
    return 1 if wrong or plain_wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        parse_profiles(args.profile)
    except ValueError as err:
        raise SystemExit(f"--profile: {err}") from None
    if args.seed < 0:
        raise SystemExit(f"--seed {args.seed}: expected a seed >= 0")
    return run(args.geometry, args.profile, args.seed)


if __name__ == "__main__":
    sys.exit(main())
