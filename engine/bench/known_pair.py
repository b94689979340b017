"""Bench-only: a target of a real geometry whose greedy continuation is known, built on the device.

Layer weights N(0, 0.002) leave the residual stream almost exactly the input token's embedding, and
tied embeddings N(0, 1) make that token's own logit (|e_t|^2 ~ hidden) tower over every other
(e_t . e_v ~ sqrt(hidden)), so every greedy step repeats the last prompt token. The forward costs the
same as any other weights of the geometry (same kernels, same bytes); only the values are chosen.
Nothing on the serving path, the CLI's generate or an env knob reaches this module (SPEC 9).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.bench.geometry import drafter_config, drafter_shapes, random_tensors, target_config, target_shapes
from engine.loader import Checkpoint

LAYER_STD = 0.002
EMBED_STD = 1.0
DRAFTER_STD = 0.02  # the random drafter's weights (its proposals are replaced; only its cost counts)
EMBED = "model.embed_tokens.weight"


def known_tensors(
    config: dict, device: torch.device, dtype: torch.dtype, seed: int = 0, layer_std: float = LAYER_STD
) -> dict[str, torch.Tensor]:
    """A tied Qwen3 target's tensors: layers N(0, layer_std), norms 1, embeddings N(0, EMBED_STD)."""
    if not config.get("tie_word_embeddings", False):
        raise ValueError("the known-continuation construction needs tied embeddings (tie_word_embeddings=True)")
    tensors = random_tensors(target_shapes(config), device, dtype, layer_std, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 7919)
    tensors[EMBED].normal_(0.0, EMBED_STD, generator=gen)
    return tensors


def known_target(
    geometry: str | dict, device: torch.device, dtype: torch.dtype, seed: int = 0, layer_std: float = LAYER_STD
) -> Checkpoint:
    """The known-continuation target of a named geometry ("4b", "tiny", "small") or an HF config dict."""
    config = target_config(geometry) if isinstance(geometry, str) else dict(geometry)
    name = f"known-{geometry if isinstance(geometry, str) else 'custom'}"
    return Checkpoint(name, config, tensors=known_tensors(config, device, dtype, seed, layer_std))


def known_pair(geometry: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> tuple[Checkpoint, Checkpoint]:
    """(known-continuation target, random DFlash drafter of the geometry's z-lab shape)."""
    d_cfg = drafter_config(geometry)
    drafter = Checkpoint(
        f"random-{geometry}-dflash",
        d_cfg,
        tensors=random_tensors(drafter_shapes(d_cfg), device, dtype, DRAFTER_STD, seed + 1),
    )
    return known_target(geometry, device, dtype, seed), drafter


def continuation(prompt: Sequence[int], length: int) -> list[int]:
    """The known greedy continuation: the last prompt token, `length` times."""
    if not prompt:
        raise ValueError("a known continuation needs a non-empty prompt")
    return [int(prompt[-1])] * length


def echo_failures(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(prompt index, first wrong position) of every output that is not its prompt's continuation."""
    bad = []
    for i, (p, out) in enumerate(zip(prompts, outputs, strict=True)):
        want = continuation(p, len(out))
        wrong = next((j for j, (a, b) in enumerate(zip(out, want, strict=True)) if a != b), None)
        if wrong is not None:
            bad.append((i, wrong))
    return bad
