"""Random tiny checkpoints in the real formats (HF Qwen3 target, z-lab DFlash drafter)."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.fixture.dflash_model import DFlashDraftModel
from engine.models.config import DFlashConfig

VOCAB = 300
EOS = 299
MASK = 298


def make_target(
    directory: Path,
    *,
    tied: bool = True,
    layers: int = 3,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    seed: int = 0,
    std: float = 0.2,
    shards: int = 1,
):
    """A random Qwen3ForCausalLM saved with save_pretrained; returns the HF model (fp32, eval)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        eos_token_id=EOS,
        rope_theta=10000.0,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    kwargs = {"max_shard_size": "100KB"} if shards > 1 else {}
    model.save_pretrained(directory, **kwargs)
    return model


def make_drafter(
    directory: Path,
    *,
    block_size: int = 6,
    layers: int = 2,
    taps=(0, 1),
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    num_target_layers: int = 3,
    seed: int = 1,
) -> DFlashDraftModel:
    torch.manual_seed(seed)
    cfg = DFlashConfig.from_dict(
        dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=10000.0,
            max_position_embeddings=512,
            vocab_size=VOCAB,
            block_size=block_size,
            num_target_layers=num_target_layers,
            dflash_config=dict(mask_token_id=MASK, target_layer_ids=list(taps)),
        )
    )
    model = DFlashDraftModel(cfg)
    model.save_pretrained(directory)
    return model


def make_dspark_drafter(
    directory: Path,
    *,
    layout: str = "deepspec",
    markov_rank: int = 16,
    block_size: int = 5,
    markov_std: float = 0.5,
    layers: int = 2,
    taps=(0, 1),
    hidden: int = 64,
    seed: int = 2,
) -> DFlashDraftModel:
    """A random drafter with a DSpark Markov head, in DeepSpec's flat layout (anchor-first, with the
    frozen embed/head copies and a confidence head that loaders ignore) or the z-lab layout with
    markov_rank inside dflash_config (anchor-drop)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    geometry = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        max_position_embeddings=512,
        vocab_size=VOCAB,
        block_size=block_size,
        num_target_layers=3,
    )
    if layout == "deepspec":
        d = dict(
            geometry,
            target_layer_ids=list(taps),
            mask_token_id=MASK,
            num_anchors=512,
            markov_rank=markov_rank,
            markov_head_type="vanilla",
            architectures=["Qwen3DSparkModel"],
        )
    else:
        d = dict(geometry, dflash_config=dict(mask_token_id=MASK, target_layer_ids=list(taps), markov_rank=markov_rank))
    model = DFlashDraftModel(DFlashConfig.from_dict(d))
    with torch.no_grad():
        model.markov_head.markov_w1.weight.normal_(0.0, 1.0)
        model.markov_head.markov_w2.weight.normal_(0.0, markov_std)
    model.save_pretrained(directory)
    if layout == "deepspec":  # DeepSpec also ships tensors the engine must ignore
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        state |= {
            "embed_tokens.weight": torch.randn(VOCAB, hidden),
            "lm_head.weight": torch.randn(VOCAB, hidden),
            "confidence_head.proj.weight": torch.randn(1, 2 * hidden),
            "confidence_head.proj.bias": torch.zeros(1),
        }
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return model
