"""The Qwen3 dense target on an `Ops` backend, with feature capture for the drafter."""

from __future__ import annotations

import logging
from functools import partial

import torch
import torch.nn.functional as F

from engine.kernels import Ops
from engine.kernels.rotary import rope_cos_sin
from engine.kernels.split_sum import dense
from engine.loader import CheckpointError, take
from engine.models.config import Qwen3Config
from engine.models.layers import AttnMeta, LayerWeights, decoder_layer

log = logging.getLogger(__name__)


class Qwen3ForCausalLM:
    """Weights fused at load (q|k|v, gate|up); the forward runs over a flat batch of rows whose
    attention metadata says where each row lives in the paged cache."""

    def __init__(
        self,
        cfg: Qwen3Config,
        tensors: dict[str, torch.Tensor],
        *,
        where: str,
        device: torch.device,
        dtype: torch.dtype,
        ops: Ops,
    ):
        g = cfg.geometry
        self.cfg, self.g, self.ops, self.device, self.dtype = cfg, g, ops, device, dtype
        tensors = dict(tensors)
        load = partial(take, tensors, where=where, device=device, dtype=dtype)
        self.embed = load("model.embed_tokens.weight", (g.vocab_size, g.hidden_size))
        self.layers = [LayerWeights.take(load, f"model.layers.{i}.", g) for i in range(g.num_layers)]
        self.norm = load("model.norm.weight", (g.hidden_size,))
        if cfg.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
            self.lm_head = self.embed
        elif "lm_head.weight" in tensors:
            self.lm_head = load("lm_head.weight", (g.vocab_size, g.hidden_size))
        else:
            raise CheckpointError(f"{where}: untied checkpoint without lm_head.weight")
        if tensors:
            log.warning("%s: ignoring %d unexpected tensors, e.g. %s", where, len(tensors), sorted(tensors)[:3])
        self.cos_sin = rope_cos_sin(g.max_position_embeddings, g.head_dim, g.rope_theta, device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMeta,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        capture_layers: tuple[int, ...] = (),
        features_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, H]. With capture_layers, writes HF hidden_states[i+1] for each
        listed layer i into features_out[:T] as one concatenated row: the residual stream after the layer,
        except after the last layer, where HF (and the DFlash reference) hand over the final-normed state."""
        g = self.g
        h = F.embedding(input_ids, self.embed)
        residual = None
        tap = {layer: j for j, layer in enumerate(capture_layers)}
        cols = features_out[: h.shape[0]].unflatten(1, (len(tap), g.hidden_size)) if tap else None  # [T, taps, H]
        last = len(self.layers) - 1
        for i, w in enumerate(self.layers):
            k_cache, v_cache = kv_caches[i]
            h, residual = decoder_layer(self.ops, g, w, h, residual, positions, meta, k_cache, v_cache, self.cos_sin)
            if i in tap and i != last:
                torch.add(dense(h), residual, out=cols[:, tap[i]])
        normed = self.ops.add_rms_norm(h, residual, self.norm, g.rms_norm_eps)[0]
        if last in tap:
            cols[:, tap[last]].copy_(normed)
        return normed

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """out: a [T, V] buffer to write them into (the runner's graph outputs) instead of a new one."""
        return self.ops.linear(hidden, self.lm_head, out=out)
