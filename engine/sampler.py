"""Greedy and seeded sampling over logit rows: vLLM's penalties, then temperature, min-p, top-k, top-p."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import SamplingParams
from engine.request import Request, RequestFailure

# A row's prior tokens: (the prompt, the output before this row's token). A verify row's output part
# is the committed output plus the drafts before it in the same round.
Prior = tuple[Sequence[int], Sequence[int]]


def penalized_logits(logits: torch.Tensor, priors: Sequence[Prior], params: Sequence[SamplingParams]) -> torch.Tensor:
    """logits [R, V] (fp32 copy) with each row's penalties (vLLM's): repetition on every token of its
    prompt or output (a positive logit divided by it, a negative one multiplied), then frequency x a
    token's count in the output and presence for every token in it subtracted. Pure: row i depends on
    logits[i], priors[i] and params[i] only."""
    x = logits.float().clone()
    vocab = x.shape[-1]
    for i, ((prompt, output), p) in enumerate(zip(priors, params, strict=True)):
        if not p.penalized:
            continue
        out = torch.tensor(list(output), dtype=torch.long, device=x.device)
        counts = torch.bincount(out, minlength=vocab)[:vocab].to(x.dtype)
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            seen[torch.tensor(list(prompt), dtype=torch.long, device=x.device)] = True
            row = x[i]
            x[i] = torch.where(seen, torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty), row)
        x[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
    return x


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax over [.., V] after temperature, min-p, top-k and top-p (at least one token always kept)."""
    x = logits.float() / params.temperature
    if params.min_p > 0.0:
        probs = x.softmax(dim=-1)
        x = x.masked_fill(probs < params.min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
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
    row_priors: Sequence[Prior] | None = None,
) -> torch.Tensor:
    """One token per row: the argmax where temperature is 0 (greedy_tokens unless penalized), else a
    seeded sample. Penalized rows need row_priors. Every sampled row's distribution is checked before
    any is drawn (BadRows), so a failure consumes no generator."""
    if all(p.greedy for p in row_params):
        return greedy_tokens
    out = greedy_tokens.clone()
    rows = [i for i, p in enumerate(row_params) if not p.greedy]
    x = logits[rows]
    if any(row_params[i].penalized for i in rows):
        if row_priors is None:
            raise ValueError("penalized rows need their prior tokens")
        x = penalized_logits(x, [row_priors[i] for i in rows], [row_params[i] for i in rows])
    drawn = [j for j, i in enumerate(rows) if row_params[i].temperature > 0]
    for j, i in enumerate(rows):
        if row_params[i].temperature == 0:
            out[i] = x[j].argmax()
    probs = [filtered_probs(x[j], row_params[rows[j]]) for j in drawn]
    bad = (~torch.isfinite(torch.stack(probs)).all(dim=-1)).nonzero().flatten().tolist() if probs else []
    if bad:
        raise BadRows([rows[drawn[b]] for b in bad])
    for j, p in zip(drawn, probs, strict=True):
        out[rows[j]] = torch.multinomial(p, 1, generator=row_generators[rows[j]])[0]
    return out


def sample_requests(
    logits: torch.Tensor,
    greedy: torch.Tensor,
    reqs: list[Request],
    rows_each: int | Sequence[int],
    drafts: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sample_rows` over `rows_each` consecutive logit rows per request (or rows_each[i] for request
    i: a ragged verify), each with its own params; row j of request i follows its output and
    drafts[i, :j] (a verify span; none for one row). A request whose rows cannot be sampled is named
    in a RequestFailure."""
    spans = [rows_each] * len(reqs) if isinstance(rows_each, int) else list(rows_each)
    owner = [r for r, span in zip(reqs, spans, strict=True) for _ in range(span)]
    params, gens = [r.params for r in owner], [r.generator for r in owner]
    priors = None
    if any(r.params.penalized for r in reqs):
        drawn = drafts.tolist() if drafts is not None else [[] for _ in reqs]
        priors = [
            (r.prompt_ids, r.output_ids + d[:j])
            for r, d, span in zip(reqs, drawn, spans, strict=True)
            for j in range(span)
        ]
    try:
        return sample_rows(logits, greedy, params, gens, priors)
    except BadRows as err:
        culprits = dict.fromkeys(owner[row] for row in err.rows)
        raise RequestFailure(
            {r: f"cannot sample: the distribution is NaN or inf ({_describe(r.params)})" for r in culprits}
        ) from err


def _describe(p: SamplingParams) -> str:
    return f"temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}, min_p={p.min_p}"
