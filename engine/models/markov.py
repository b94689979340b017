"""The DSpark Markov head, walked left to right over the draft rows: x_k = argmax(U_k + W2 W1[x_{k-1}]),
x_{-1} the anchor, U_k the backbone's logits, W1 and W2 [V, r] (docs/design/hedging.md, section 1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def _argmax(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)


def markov_bias(prev: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, linear: Callable = F.linear) -> torch.Tensor:
    """Previous tokens [...] -> the head's bias W2 W1[prev] [..., V]."""
    return linear(F.embedding(prev, w1), w2)


def markov_walk(
    logits: torch.Tensor,
    anchors: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    positions: Sequence[int] = (),
    linear: Callable = F.linear,
    argmax: Callable = _argmax,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy Markov walk for a batch, plus hedge chains: chain j follows the main walk before
    positions[j], takes the main walk's runner-up there, then walks on. Graph-capturable.

    logits: [N, D, V] backbone logits of the D draft rows; anchors: [N] int64.
    positions: branch positions (Python ints < D; part of the captured shape).
    Returns drafts [N, D] int64 and chains [N, P, D] (None without positions).
    Scores are summed in fp32; `linear` / `argmax` are the backend's ops (ties: lowest index)."""
    n, d, _ = logits.shape
    p = len(positions)
    rows = n * (1 + p)
    # Main rows first, then chain rows request-major: chain row (i, j) reads request i's logits.
    src = torch.arange(n, device=logits.device)
    if p:
        src = torch.cat([src, src[:, None].expand(n, p).reshape(-1)])
        prev = torch.cat([anchors, anchors[:, None].expand(n, p).reshape(-1)])
    else:
        prev = anchors
    out = []
    for k in range(d):
        base = logits[:, k].index_select(0, src) if p else logits[:, k]
        scores = base.float() + markov_bias(prev, w1, w2, linear).float()
        top = argmax(scores.view(rows, -1))
        if p:
            main = top[:n]
            chain_top = top[n:].view(n, p)
            runner = argmax(scores[n:].scatter(1, top[n:, None], float("-inf"))).view(n, p)
            cols = []
            for j, pos in enumerate(positions):  # static per capture: no device tensor for positions
                cols.append(main if k < pos else runner[:, j] if k == pos else chain_top[:, j])
            top = torch.cat([main, torch.stack(cols, dim=1).reshape(-1)])
        out.append(top)
        prev = top
    tokens = torch.stack(out, dim=1)
    return tokens[:n], (tokens[n:].view(n, p, d) if p else None)
