"""A cost model of speculative decoding: committed tokens from per-position acceptance, round time from
a measured cost table (`engine.bench profile`: verify ms per (batch, span), drafter ms per batch).

    table = CostTable.from_rows(read_csv(Path("profile.csv")))
    tok_s = steady_tok_s(table, batch=64, drafts=4, conditional=profile.conditional)

The table and expected_committed live in the engine (engine/costs.py: the adaptive policy uses them);
this module adds the steady-state and whole-request views the study needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.policy.costs import CostTable, expected_committed

__all__ = ["CostTable", "best_arm", "committed_pmf", "expected_committed", "steady_tok_s", "truncated_tau"]


def committed_pmf(conditional: Sequence[float], drafts: int) -> list[float]:
    """pmf[n] = P(exactly n of `drafts` drafts accepted), n = 0..drafts."""
    pmf, p = [], 1.0
    for a in conditional[:drafts]:
        pmf.append(p * (1.0 - a))
        p *= a
    return [*pmf, p]


def truncated_tau(conditional: Sequence[float], drafts: int, tokens: int) -> float:
    """Committed tokens per round over a request whose rounds produce `tokens` tokens, each round's
    accepted drafts capped at the tokens left minus the bonus (the engine's draft limit): the ratio
    of expectations tokens / E[rounds], by dynamic programming over the tokens left."""
    if tokens < 1:
        raise ValueError(f"tokens={tokens}: must be >= 1")
    pmf = committed_pmf(conditional, drafts)
    rounds = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        cap = max(0, min(drafts, left - 1))
        expected = 1.0
        for n, p in enumerate(pmf):
            expected += p * rounds[left - 1 - min(n, cap)]
        rounds[left] = expected
    return tokens / rounds[tokens]


def steady_tok_s(
    table: CostTable, batch: int, drafts: int | None, conditional: Sequence[float] = (), gate: int = 0
) -> float:
    """Output tokens/s of `batch` requests decoding in lockstep, no prefill or drain: drafts None is
    plain decode; a gate at or under the batch runs gated rounds (plain steps)."""
    if drafts is None:
        return 1e3 * batch / table.decode_ms(batch)
    if gate and batch >= gate:
        return 1e3 * batch / table.gated_ms(batch)
    return 1e3 * batch * expected_committed(conditional, drafts) / table.round_ms(batch, drafts)


def best_arm(predicted: dict[str, float]) -> str:
    """The arm with the highest predicted tok/s (ties: the first given)."""
    return max(predicted, key=lambda arm: predicted[arm])
