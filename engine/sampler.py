"""Greedy and seeded temperature / top-k / top-p sampling over logit rows."""

from __future__ import annotations

import torch

from engine.config import SamplingParams
from engine.request import Request


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax over [.., V] after temperature, top-k and top-p (at least one token always kept)."""
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > params.top_p
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return x.softmax(dim=-1)


def sample_rows(
    logits: torch.Tensor,
    greedy_tokens: torch.Tensor,
    row_params: list[SamplingParams],
    row_generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row: the greedy argmax where temperature is 0, else a seeded sample."""
    if all(p.greedy for p in row_params):
        return greedy_tokens
    out = greedy_tokens.clone()
    for i, (params, gen) in enumerate(zip(row_params, row_generators, strict=True)):
        if not params.greedy:
            out[i] = torch.multinomial(filtered_probs(logits[i], params), 1, generator=gen)[0]
    return out


def sample_requests(logits: torch.Tensor, greedy: torch.Tensor, reqs: list[Request], rows_each: int) -> torch.Tensor:
    """`sample_rows` over `rows_each` consecutive logit rows per request, each with its own params."""
    params = [r.params for r in reqs for _ in range(rows_each)]
    gens = [r.generator for r in reqs for _ in range(rows_each)]
    return sample_rows(logits, greedy, params, gens)
