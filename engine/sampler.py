"""Greedy and seeded temperature / top-k / top-p sampling over logit rows."""

from __future__ import annotations

import torch

from engine.config import SamplingParams
from engine.request import Request, RequestFailure


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax over [.., V] after temperature, top-k and top-p (at least one token always kept)."""
    x = logits.float() / params.temperature
    if 0 < params.top_k < x.shape[-1]:  # 0 and -1: off
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > params.top_p
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return x.softmax(dim=-1)


class BadRows(ValueError):
    """Sampled rows whose distribution is not one (NaN or inf after temperature, top-k and top-p)."""

    def __init__(self, rows: list[int]):
        super().__init__(f"rows {rows} have no valid sampling distribution")
        self.rows = rows


def sample_rows(
    logits: torch.Tensor,
    greedy_tokens: torch.Tensor,
    row_params: list[SamplingParams],
    row_generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row: the greedy argmax where temperature is 0, else a seeded sample. Every
    sampled row's distribution is checked before any is drawn (BadRows), so a failure consumes no
    generator."""
    if all(p.greedy for p in row_params):
        return greedy_tokens
    out = greedy_tokens.clone()
    rows = [i for i, p in enumerate(row_params) if not p.greedy]
    probs = [filtered_probs(logits[i], row_params[i]) for i in rows]
    bad = (~torch.isfinite(torch.stack(probs)).all(dim=-1)).nonzero().flatten().tolist()
    if bad:
        raise BadRows([rows[j] for j in bad])
    for i, p in zip(rows, probs, strict=True):
        out[i] = torch.multinomial(p, 1, generator=row_generators[i])[0]
    return out


def sample_requests(logits: torch.Tensor, greedy: torch.Tensor, reqs: list[Request], rows_each: int) -> torch.Tensor:
    """`sample_rows` over `rows_each` consecutive logit rows per request, each with its own params;
    a request whose rows cannot be sampled is named in a RequestFailure."""
    params = [r.params for r in reqs for _ in range(rows_each)]
    gens = [r.generator for r in reqs for _ in range(rows_each)]
    try:
        return sample_rows(logits, greedy, params, gens)
    except BadRows as err:
        culprits = dict.fromkeys(reqs[row // rows_each] for row in err.rows)
        raise RequestFailure(
            {r: f"cannot sample: the distribution is NaN or inf ({_describe(r.params)})" for r in culprits}
        ) from err


def _describe(p: SamplingParams) -> str:
    return f"temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}"
