"""Greedy argmax and prefix acceptance."""
from __future__ import annotations

import torch


def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """[M, V] -> int64 [M]; ties resolve to the lowest index."""
    return logits.argmax(dim=-1)


def accept_prefix_ref(drafts: torch.Tensor, targets: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """Longest accepted prefix per row.

    drafts: [N, k] proposed tokens d1..dk; targets: [N, k+1] the target's token at each span
    position; limits: [N] how many drafts of the row may be accepted (<= k).
    Returns int64 [N]: n = number of leading i < limit with drafts[i] == targets[i].
    """
    n_rows, k = drafts.shape
    if k == 0:
        return torch.zeros(n_rows, dtype=torch.int64, device=drafts.device)
    idx = torch.arange(k, device=drafts.device)
    match = (drafts == targets[:, :k]) & (idx[None, :] < limits[:, None])
    return match.to(torch.int64).cumprod(dim=1).sum(dim=1)
