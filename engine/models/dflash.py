"""The DFlash block drafter: one torch module for training, the reference loop and the engine.

Context injection: ctx = hidden_norm(fc(concat(target features))). Every layer projects ctx with
its own k/v projections and prepends those rows to the block's keys/values; block rows see every
context row and each other (no causal mask inside the block). Embedding and LM head are the target's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.norm import rms_norm_ref
from engine.kernels.rope import apply_rope_ref, rope_cos_sin
from engine.loader import CheckpointError, load_tensors, read_config
from engine.models.config import DFlashConfig, Geometry
from engine.models.markov import MarkovHead, markov_walk_ref

log = logging.getLogger(__name__)
MARKOV_W1 = "markov_head.markov_w1.weight"
MARKOV_W2 = "markov_head.markov_w2.weight"
# Shipped by DeepSpec checkpoints and not used here: frozen copies of the target's embedding/head,
# and DSpark's confidence head (verify-window truncation is not implemented).
IGNORED_PREFIXES = ("embed_tokens.", "lm_head.", "confidence_head.")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_ref(x, self.weight, self.eps)


class DraftAttention(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.g = g
        self.q_proj = nn.Linear(g.hidden_size, g.q_size, bias=False)
        self.k_proj = nn.Linear(g.hidden_size, g.kv_size, bias=False)
        self.v_proj = nn.Linear(g.hidden_size, g.kv_size, bias=False)
        self.o_proj = nn.Linear(g.q_size, g.hidden_size, bias=False)
        self.q_norm = RMSNorm(g.head_dim, g.rms_norm_eps)
        self.k_norm = RMSNorm(g.head_dim, g.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        q_rope: torch.Tensor,
        k_rope: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        g = self.g
        b, lq, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)
        q = self.q_norm(self.q_proj(x).view(b, lq, g.num_heads, g.head_dim))
        k = self.k_norm(self.k_proj(kv_in).view(b, kv_in.shape[1], g.num_kv_heads, g.head_dim))
        v = self.v_proj(kv_in).view(b, kv_in.shape[1], g.num_kv_heads, g.head_dim)
        q = apply_rope_ref(q, q_rope).transpose(1, 2)
        k = apply_rope_ref(k, k_rope).transpose(1, 2)
        v = v.transpose(1, 2)
        group = g.num_heads // g.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        attn_mask = None if mask is None else mask[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=g.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, lq, g.q_size))


class DraftMLP(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.self_attn = DraftAttention(g)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = DraftMLP(g)

    def forward(self, h, ctx, q_rope, k_rope, mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx, q_rope, k_rope, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(nn.Module):
    """Parameter names equal the z-lab checkpoint's tensor names (no embedding, no head), plus the
    DSpark Markov head (markov_head.*) when markov_rank > 0."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        g = cfg.geometry
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_size, g.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(g) for _ in range(g.num_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.markov_head = MarkovHead(g.vocab_size, cfg.markov_rank) if cfg.markov_rank else None
        self._cos_sin: torch.Tensor | None = None

    def rope_table(self, device: torch.device) -> torch.Tensor:
        g = self.cfg.geometry
        if self._cos_sin is None or self._cos_sin.device != device:
            self._cos_sin = rope_cos_sin(g.max_position_embeddings, g.head_dim, g.rope_theta, device)
        return self._cos_sin

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """[..., n_taps * H] target features -> [..., H] context rows."""
        return self.hidden_norm(self.fc(features))

    def forward(
        self,
        block_hidden: torch.Tensor,
        ctx: torch.Tensor,
        block_pos: torch.Tensor,
        ctx_pos: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Dense forward. block_hidden: [b, Lq, H] (embedded block tokens); ctx: [b, Lc, H] projected
        context; block_pos: [b, Lq]; ctx_pos: [b, Lc]; mask: [b, Lq, Lc + Lq] bool (True = may attend)
        or None (every row sees everything). Returns the final-normed hidden states [b, Lq, H]."""
        table = self.rope_table(block_hidden.device)
        q_rope = table[block_pos]
        k_rope = table[torch.cat([ctx_pos, block_pos], dim=1)]
        h = block_hidden
        for layer in self.layers:
            h = layer(h, ctx, q_rope, k_rope, mask)
        return self.norm(h)

    def draft_rows(self) -> slice:
        """Block rows whose outputs are drafts: all B (anchor-first) or rows 1..B-1 (anchor-drop)."""
        return slice(0, None) if self.cfg.anchor_first else slice(1, None)

    def propose(self, logits: torch.Tensor, anchor: int) -> list[int]:
        """Draft tokens from the draft rows' logits [D, V]: argmax per row, or the Markov walk."""
        if self.markov_head is None:
            return logits.argmax(-1).tolist()
        return markov_walk_ref(logits, anchor, self.markov_head)

    def save_pretrained(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> DFlashDraftModel:
        directory = Path(directory)
        cfg = DFlashConfig.from_dict(read_config(directory), where=str(directory))
        model = cls(cfg)
        tensors = {k: v for k, v in load_tensors(directory).items() if not k.startswith(IGNORED_PREFIXES)}
        expected = model.state_dict()
        missing = sorted(set(expected) - set(tensors))
        if missing:
            raise CheckpointError(
                f"{directory}: drafter checkpoint lacks {missing[:4]}{'...' if len(missing) > 4 else ''}"
            )
        for name, param in expected.items():
            if tuple(tensors[name].shape) != tuple(param.shape):
                got = tuple(tensors[name].shape)
                raise CheckpointError(f"{directory}: tensor {name!r} has shape {got}, expected {tuple(param.shape)}")
        model.load_state_dict({k: tensors[k] for k in expected}, strict=True)
        return model.to(device=device, dtype=dtype)


class DFlashDrafter:
    """Inference side of the drafter on an `Ops` backend: context rows are projected once and
    their K/V stored into the drafter's paged cache; the block runs non-causally over it."""

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
        from engine.loader import take
        from engine.models.layers import LayerWeights

        g = cfg.geometry
        self.cfg, self.g, self.ops, self.target = cfg, g, ops, target
        tensors = {k: v for k, v in tensors.items() if not k.startswith(IGNORED_PREFIXES)}

        def load(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return take(tensors, name, shape, where, device, dtype)

        self.fc = load("fc.weight", (g.hidden_size, cfg.feature_size))
        self.hidden_norm = load("hidden_norm.weight", (g.hidden_size,))
        self.layers = [LayerWeights.take(tensors, f"layers.{i}.", g, where, device, dtype) for i in range(g.num_layers)]
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
        kv = ops.linear(ctx, self.ctx_kv)
        rows, width = kv.shape[0], 2 * g.kv_size
        for i, w in enumerate(self.layers):
            k = kv[:, i * width : i * width + g.kv_size].view(rows, g.num_kv_heads, g.head_dim)
            v = kv[:, i * width + g.kv_size : (i + 1) * width].view(rows, g.num_kv_heads, g.head_dim)
            k_cache, v_cache = kv_caches[i]
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
        from engine.models.layers import decoder_layer

        h = F.embedding(block_ids, self.target.embed)
        residual = None
        for i, w in enumerate(self.layers):
            k_cache, v_cache = kv_caches[i]
            h, residual = decoder_layer(
                self.ops, self.g, w, h, residual, positions, meta, k_cache, v_cache, self.cos_sin
            )
        return self.ops.add_rms_norm(h, residual, self.norm, self.g.rms_norm_eps)[0]
