"""Model geometries for weight-free benches: Qwen3-4B and a DFlash-4B-shaped drafter, or a fixture
recipe's shapes, as HF-style config dicts plus random tensors built straight on the device and handed
to the engine as an in-memory Checkpoint (nothing is written to disk)."""

from __future__ import annotations

import dataclasses

import torch

from engine.fixture.config_json import zlab_dict
from engine.loader import Checkpoint
from engine.models.config import ZLAB, DFlashConfig, Geometry

GEOMETRIES = ("4b", "tiny", "small")

# Qwen3-4B's config.json (geometry fields). Random weights: the numbers a bench reports depend on
# shapes only (greedy argmax and paged KV cost the same for any values).
QWEN3_4B: dict = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "eos_token_id": None,  # random weights: nothing should stop a run early
    "bos_token_id": None,
}

# z-lab DFlash drafter for Qwen3-4B: 5 layers of the target's width, block 16, five taps.
DFLASH_4B = {"num_layers": 5, "block_size": 16, "taps": (1, 9, 17, 25, 33), "mask_token_id": 151669}


def _recipe(name: str):
    from engine.fixture.recipes import get_recipe

    return get_recipe(name)


def target_config(geometry: str) -> dict:
    """The target's HF config dict for "4b" or a fixture recipe name ("tiny", "small")."""
    if geometry == "4b":
        return dict(QWEN3_4B)
    r = _recipe(geometry)
    return {
        **QWEN3_4B,
        "vocab_size": r.vocab_size,
        "hidden_size": r.hidden_size,
        "intermediate_size": r.intermediate_size,
        "num_hidden_layers": r.num_layers,
        "num_attention_heads": r.num_heads,
        "num_key_value_heads": r.num_kv_heads,
        "head_dim": r.head_dim,
        "rope_theta": r.rope_theta,
        "max_position_embeddings": r.max_position_embeddings,
        "tie_word_embeddings": r.tie_word_embeddings,
    }


def drafter_config(geometry: str) -> dict:
    """A z-lab DFlash drafter config that fits target_config(geometry)."""
    t = Geometry.from_dict(target_config(geometry), geometry)
    if geometry == "4b":
        layers, block, taps, mask = (DFLASH_4B[k] for k in ("num_layers", "block_size", "taps", "mask_token_id"))
    else:
        r = _recipe(geometry)
        layers, block, taps, mask = r.drafter_layers, r.block_size, tuple(r.target_layer_ids), t.vocab_size - 1
    g = dataclasses.replace(t, num_layers=layers)
    cfg = DFlashConfig(g, block, mask, tuple(taps), ZLAB, num_target_layers=t.num_layers)
    return zlab_dict(cfg)


def target_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF Qwen3ForCausalLM tensor names and shapes (lm_head only when untied)."""
    g = Geometry.from_dict(config, "target")
    shapes = {"model.embed_tokens.weight": (g.vocab_size, g.hidden_size), "model.norm.weight": (g.hidden_size,)}
    for i in range(g.num_layers):
        shapes.update({f"model.layers.{i}.{k}": v for k, v in _layer_shapes(g).items()})
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (g.vocab_size, g.hidden_size)
    return shapes


def drafter_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """z-lab DFlash drafter tensor names and shapes (no embedding, no head: the target's are used)."""
    cfg = DFlashConfig.from_dict(config)
    g = cfg.geometry
    shapes = {
        "fc.weight": (g.hidden_size, cfg.feature_size),
        "hidden_norm.weight": (g.hidden_size,),
        "norm.weight": (g.hidden_size,),
    }
    for i in range(g.num_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in _layer_shapes(g).items()})
    return shapes


def _layer_shapes(g: Geometry) -> dict[str, tuple[int, ...]]:
    h, i = g.hidden_size, g.intermediate_size
    return {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (g.q_size, h),
        "self_attn.k_proj.weight": (g.kv_size, h),
        "self_attn.v_proj.weight": (g.kv_size, h),
        "self_attn.o_proj.weight": (h, g.q_size),
        "self_attn.q_norm.weight": (g.head_dim,),
        "self_attn.k_norm.weight": (g.head_dim,),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }


def random_tensors(
    shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype, std: float = 0.02, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Norm weights 1, everything else N(0, std): small std keeps a deep random stack finite."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            out[name] = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)
    return out


def random_pair(
    geometry: str, device: torch.device, dtype: torch.dtype, std: float = 0.02, seed: int = 0
) -> tuple[Checkpoint, Checkpoint]:
    """(target, drafter) in-memory checkpoints with random weights of a named geometry."""
    t_cfg, d_cfg = target_config(geometry), drafter_config(geometry)
    target = Checkpoint(
        f"random-{geometry}", t_cfg, tensors=random_tensors(target_shapes(t_cfg), device, dtype, std, seed)
    )
    drafter = Checkpoint(
        f"random-{geometry}-dflash", d_cfg, tensors=random_tensors(drafter_shapes(d_cfg), device, dtype, std, seed + 1)
    )
    return target, drafter
