"""Log-probabilities of committed tokens, from the logit rows the step already computed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.request import Request


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float  # under the target's raw distribution (before temperature, top-k, top-p)
    top: tuple[tuple[int, float], ...]  # the k most likely (token id, logprob), most likely first
    rank: int  # the chosen token's 1-based rank in that distribution (1 + how many are likelier)


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """logits [len(tokens), V]: row i is the distribution tokens[i] was chosen from."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    picked = lp.gather(1, torch.tensor(list(tokens), device=lp.device)[:, None])
    chosen, ranks = picked[:, 0].tolist(), (1 + (lp > picked).sum(dim=-1)).tolist()
    values, ids = lp.topk(k, dim=-1)  # k = 0: an empty top per row
    tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return [TokenLogprob(*entry) for entry in zip(tokens, chosen, tops, ranks, strict=True)]


def record_logprobs(
    reqs: Sequence[Request],
    logits: torch.Tensor,
    span: int | Sequence[int],
    counts: Sequence[int],
    groups: Sequence[int] | None = None,
) -> None:
    """For each request that asked: its last counts[i] committed tokens were chosen from logit rows
    [start, start + counts[i]) of its row group g = groups[i] (default i), which starts at g * span
    (or span[g]: each group's first row, a ragged verify)."""
    for i, r in enumerate(reqs):
        if r.params.logprobs is None or not counts[i]:
            continue
        g = i if groups is None else groups[i]
        start = g * span if isinstance(span, int) else span[g]
        rows = logits[start : start + counts[i]]
        r.scored(token_logprobs(rows, r.output_ids[-counts[i] :], r.params.logprobs))
