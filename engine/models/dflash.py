"""The DFlash block drafter's inference side on an `Ops` backend: context rows' K/V stored once into its paged
cache, the block run non-causally over them (the training module: engine/fixture/dflash_model.py)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from engine.kernels.rotary import rope_cos_sin
from engine.loader import CheckpointError, take
from engine.models.config import DFlashConfig
from engine.models.layers import LayerWeights, decoder_layer

MARKOV_W1 = "markov_head.markov_w1.weight"
MARKOV_W2 = "markov_head.markov_w2.weight"
# Shipped by DeepSpec checkpoints and not used here: frozen copies of the target's embedding/head,
# and DSpark's confidence head (verify-window truncation is not implemented).
IGNORED_PREFIXES = ("embed_tokens.", "lm_head.", "confidence_head.")


class DFlashDrafter:
    def __init__(
        self,
        cfg: DFlashConfig,
        tensors: dict[str, torch.Tensor],
        *,
        where: str,
        target,
        device: torch.device,
        dtype: torch.dtype,
        ops,
    ):
        g = cfg.geometry
        self.cfg, self.g, self.ops, self.target = cfg, g, ops, target
        tensors = {k: v for k, v in tensors.items() if not k.startswith(IGNORED_PREFIXES)}
        load = partial(take, tensors, where=where, device=device, dtype=dtype)
        self.fc = load("fc.weight", (g.hidden_size, cfg.feature_size))
        self.hidden_norm = load("hidden_norm.weight", (g.hidden_size,))
        self.layers = [LayerWeights.take(load, f"layers.{i}.", g) for i in range(g.num_layers)]
        self.norm = load("norm.weight", (g.hidden_size,))
        # Every layer's k|v projection of the context rows in one GEMM.
        self.ctx_kv = torch.cat([w.qkv[g.q_size :] for w in self.layers]).contiguous()
        # DSpark Markov head, kept in the model dtype; the walk sums its bias in fp32.
        self.markov: tuple[torch.Tensor, torch.Tensor] | None = None
        if cfg.markov_rank:
            shape = (g.vocab_size, cfg.markov_rank)
            self.markov = (load(MARKOV_W1, shape), load(MARKOV_W2, shape))
        elif any(k.startswith("markov_head.") for k in tensors):
            raise CheckpointError(f"{where}: markov_head tensors but markov_rank is 0 in the config")
        if tensors:
            raise CheckpointError(f"{where}: unexpected drafter tensors {sorted(tensors)[:4]}")
        self.cos_sin = rope_cos_sin(g.max_position_embeddings, g.head_dim, g.rope_theta, device)

    def store_context(
        self,
        features: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Project target feature rows [C, n_taps * H] and write each layer's context K/V."""
        g, ops = self.g, self.ops
        ctx = ops.rms_norm(ops.linear(features, self.fc), self.hidden_norm, g.rms_norm_eps)
        kv = ops.linear(ctx, self.ctx_kv).unflatten(1, (len(self.layers), 2, g.num_kv_heads, g.head_dim))
        for i, (w, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            k, v = kv[:, i, 0], kv[:, i, 1]
            ops.qk_norm_rope_store(
                None, k, v, positions, slot_mapping, None, w.k_norm, self.cos_sin, k_cache, v_cache, g.rms_norm_eps
            )

    def forward_block(
        self,
        block_ids: torch.Tensor,
        positions: torch.Tensor,
        meta,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Block rows [N * B] -> final-normed hidden [N * B, H]; meta must be non-causal."""
        h = F.embedding(block_ids, self.target.embed)
        residual = None
        for w, (k, v) in zip(self.layers, kv_caches, strict=True):
            h, residual = decoder_layer(self.ops, self.g, w, h, residual, positions, meta, k, v, self.cos_sin)
        return self.ops.add_rms_norm(h, residual, self.norm, self.g.rms_norm_eps)[0]
