"""The per-request inputs a decode, draft or verify step reads on the device (ModelRunner.stage): one int64
row per field, one column per request, padded to the graph bucket with the null row; copied from pinned
memory once per step, or advanced on the device for a round launched ahead (engine/decode_overlap.py)."""

from __future__ import annotations

import torch

from engine.request import Request

# current token, table row, committed rows, draft limit, budget: one row each
FIELDS = ("token", "row", "num_kv", "limit", "remaining")


def draft_limit(k: int, remaining: int | torch.Tensor) -> int | torch.Tensor:
    """Drafts a request may accept: its budget left minus the bonus token, so a round never overshoots
    max_tokens; elementwise on a tensor of budgets (a round staged on the device)."""
    if isinstance(remaining, torch.Tensor):
        return (remaining - 1).clamp(0, k)
    return max(0, min(k, remaining - 1))


class StagedInputs:
    def __init__(self, width: int, device: torch.device, null_row: int):
        pinned = device.type == "cuda"
        self.buffer = torch.zeros(len(FIELDS), width, dtype=torch.int64, device=device)
        self._host = torch.zeros(len(FIELDS), width, dtype=torch.int64, pin_memory=pinned)
        self._copied = torch.cuda.Event() if pinned else None
        self.null_row = null_row
        self.reqs: list[Request] | None = None  # the requests staged, in column order

    def copy(self, reqs: list[Request], fields: list[list[int]]) -> None:
        """One list per field, each of the (padded) step width, to the device in one transfer."""
        if self._copied is not None:
            self._copied.synchronize()  # the pinned buffer's previous copy has left
        self._host[:, : len(fields[0])] = torch.tensor(fields, dtype=torch.int64)
        self.buffer.copy_(self._host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.reqs = reqs

    def field(self, name: str, m: int) -> torch.Tensor:
        return self.buffer[FIELDS.index(name), :m]

    def check(self, reqs: list[Request]) -> None:
        if self.reqs is not reqs and self.reqs != reqs:
            raise RuntimeError("stage(reqs) must run before a decode, draft or verify of the same requests")

    def advance_round(self, reqs: list[Request], rows: torch.Tensor, k: int, index: torch.Tensor | None) -> None:
        """Stage, in stream order, the speculative round of span k after the staged one, from that round's
        accept rows [M, 2j + 2] (its span j; not yet read by the host). reqs[i] is its request index[i]
        (None: the same requests): its anchor is its bonus token t_n, its committed rows grow by n + 1, its
        budget shrinks by as much, its limit is draft_limit(k, budget)."""
        n, buffer = len(reqs), self.buffer
        if index is not None:  # some requests ended: the others move up, the rest become padding
            buffer[:, :n] = buffer[:, index]
            buffer[:, n : rows.shape[0]] = 0
            buffer[FIELDS.index("row"), n : rows.shape[0]] = self.null_row
            rows = rows[index]
        token, _, num_kv, limit, remaining = buffer[:, :n]
        accepted = rows[:, 0]
        token.copy_(rows.gather(1, (rows.shape[1] // 2 + accepted)[:, None])[:, 0])
        num_kv.add_(accepted + 1)
        remaining.sub_(accepted + 1)
        limit.copy_(draft_limit(k, remaining))
        self.reqs = reqs
