"""Roofline arithmetic for a Qwen3 geometry (peers-and-anchors.md section C): bytes a decode step must
move, FLOPs a prefill must do, and the whole-workload floor at measured ceilings. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.models.config import Geometry


def _geometry(config: dict) -> Geometry:
    return Geometry.from_dict(config, "roofline")


def linear_params_per_layer(config: dict) -> int:
    g = _geometry(config)
    attn = g.hidden_size * (g.q_size + 2 * g.kv_size) + g.q_size * g.hidden_size
    return attn + 3 * g.hidden_size * g.intermediate_size


def param_count(config: dict) -> int:
    """Every weight once: embedding (= the LM head when tied), layers with their norms, final norm."""
    g = _geometry(config)
    norms = 2 * g.hidden_size + 2 * g.head_dim
    head = 0 if config.get("tie_word_embeddings", False) else g.vocab_size * g.hidden_size
    return (
        g.vocab_size * g.hidden_size + head + g.num_layers * (linear_params_per_layer(config) + norms) + g.hidden_size
    )


def weight_bytes(config: dict, dtype_bytes: int = 2) -> int:
    """Bytes a decode step reads in weights: all of them once (the tied head is the embedding; a step
    reads only its own rows of the embedding table, which is why counting it once is the floor)."""
    return param_count(config) * dtype_bytes


def kv_bytes_per_token(config: dict, dtype_bytes: int = 2) -> int:
    """K and V of one token over every layer: 147,456 B for Qwen3-4B in bf16."""
    g = _geometry(config)
    return g.num_layers * 2 * g.num_kv_heads * g.head_dim * dtype_bytes


def decode_step_bytes(config: dict, contexts: Sequence[int], dtype_bytes: int = 2) -> int:
    """Weights once + the K/V of every context token of every request (contexts: tokens each request
    attends to in this step, its own new token included)."""
    return weight_bytes(config, dtype_bytes) + sum(contexts) * kv_bytes_per_token(config, dtype_bytes)


def decode_contexts(batch: int, prompt_len: int, step: int) -> list[int]:
    """Contexts of a lockstep batch at decode step `step` (1-based: the prefill produced token 1, decode
    step k writes the token at position prompt_len + k - 1 and attends over prompt_len + k tokens)."""
    return [prompt_len + step] * batch


def decode_flops(config: dict, contexts: Sequence[int]) -> float:
    g = _geometry(config)
    rows = len(contexts)
    dense = 2 * rows * (g.num_layers * linear_params_per_layer(config) + g.vocab_size * g.hidden_size)
    attn = 4 * g.num_layers * g.num_heads * g.head_dim * sum(contexts)
    return float(dense + attn)


def prefill_flops(config: dict, prompt_lens: Sequence[int]) -> float:
    """Dense layers over every prompt token, the LM head on each prompt's last row only (that is all
    the engine computes), and causal attention (QK^T and PV over P(P+1)/2 pairs each)."""
    g = _geometry(config)
    tokens = sum(prompt_lens)
    dense = 2 * tokens * g.num_layers * linear_params_per_layer(config)
    head = 2 * len(prompt_lens) * g.vocab_size * g.hidden_size
    attn = sum(2 * p * (p + 1) * g.head_dim * g.num_heads for p in prompt_lens) * g.num_layers
    return float(dense + head + attn)


@dataclass(frozen=True)
class Floor:
    prefill_s: float
    decode_s: float
    decode_step_bytes_mean: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def workload_floor(
    config: dict, batch: int, prompt_len: int, new_tokens: int, bandwidth: float, flop_rate: float, dtype_bytes: int = 2
) -> Floor:
    """Lower bound on `batch` requests of `prompt_len` -> `new_tokens` submitted at once: the prefill at
    max(FLOPs / flop_rate, weights + written KV / bandwidth), then new_tokens - 1 decode steps at
    max(weights + KV read / bandwidth, FLOPs / flop_rate); bandwidth B/s, flop_rate FLOP/s."""
    kvb = kv_bytes_per_token(config, dtype_bytes)
    w = weight_bytes(config, dtype_bytes)
    prefill = max(prefill_flops(config, [prompt_len] * batch) / flop_rate, (w + batch * prompt_len * kvb) / bandwidth)
    decode, total_bytes = 0.0, 0
    for step in range(1, new_tokens):
        ctx = decode_contexts(batch, prompt_len, step)
        nbytes = decode_step_bytes(config, ctx, dtype_bytes)
        total_bytes += nbytes
        decode += max(nbytes / bandwidth, decode_flops(config, ctx) / flop_rate)
    steps = max(1, new_tokens - 1)
    return Floor(prefill, decode, total_bytes / steps)
