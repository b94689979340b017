"""The adaptive policy's probes (engine/policy.py): now and then one round tries a larger K than the
one in force, so an estimate that the batch's cost keeps gated (nothing observed) or the positions past
the K in force are refreshed."""

from __future__ import annotations

PROBE_FIRST, PROBE_MAX, PROBE_FLOOR = 16, 512, 0.7  # spacing (x a probe's loss) first, last; least value ratio
PROBE_LOSS_LEAST = 0.1  # a probe's expected loss is counted as at least this share of its ms
PROBE_CEILING = 0.9  # out of the gated round, a probe's K must beat it at this acceptance per position
PROBE_WAVE_LEFT = 4  # a probe in a wave needs this many of its spans (1 + K tokens) left to every request

ProbeState = tuple[tuple[int, int], list[float]]  # ((batch bucket, K in force), [ms since a probe, spacing])


def choose_probe(
    probes: dict[tuple[int, int], list[float]],
    batch: int,
    k_in_force: int,
    starved: bool,
    times: dict[int, float],
    values: dict[int, float],
    wave_left: int | None,
    gated_bar: float,
    jump: float,
) -> tuple[int, ProbeState]:
    """This round's K and its probe state: the K in force, or the best larger K when it is worth
    PROBE_FLOOR of it and the rounds under the K in force since the last probe took its spacing times
    the probe's expected loss (a starved estimate relaxes instead): its ms times the share of value it
    gives up, scaled so a probe at PROBE_FLOOR waits its spacing times its ms, one near break-even a
    third of that (by ms alone, `code` c=64 on the H200 at f4464a4 gated a whole wave: a 4-draft probe
    at ~0.85 of the gated round came due too late). Only where what a probe may find pays: where its K
    at PROBE_CEILING acceptance leads the K in force there by less than `jump`, the probe waits its
    whole ms (at 76da6b5 near break-even probes of 2-8 drafts at `code` c=128, which at best lead the
    gated round by 16-24 %, came due three times as often and cost those runs 6-7 %). The spacing doubles
    up to PROBE_MAX while probes change nothing. It and the ms since a probe are kept per batch bucket
    (powers of two) and K in force (`probes`; the caller passes none where the estimate moved K at an
    unchanged batch): kept per K alone, they restarted whenever the load moved K, and the H200 study's
    cells probed anew in every 64-token wave (532fe16: `code` c=128 waves that probed ran 0.82-0.92 of
    plain, the others 0.96-1.03). Waves probe too (3cd81a7 probed none: `code` c=64 gated every wave on
    `chat` c=32's estimate, -24 % against trim 8), but a probe due near a wave's end (wave_left: the
    fewest tokens any request has left) waits for the next: a lockstep wave ends with its slowest
    request, so a late probe cannot shorten it (bc80d89: c=128 cells probed in their last rounds, -8-10
    % to plain). Out of the gated round (gated_bar: the value per ms it must beat by the policy's
    margin), no probe tries a K that would not beat it at PROBE_CEILING acceptance (c1e25cd, 54c876b:
    4-draft probes of 31 ms against 5.2 ms gated rounds at c=256, ahead by 2-6 % only with every draft
    accepted, cost the adaptive arm 2-9 % of a run: in a lockstep wave of 256 a probe cannot shorten the
    wave)."""
    key = (batch.bit_length(), k_in_force)
    since, spacing = probes.get(key, (0.0, PROBE_FIRST))
    larger = {k: v for k, v in values.items() if k > k_in_force and _at_ceiling(k) / times[k] > gated_bar}
    if larger and not (k_in_force == 0 and starved):
        k = max(larger, key=lambda k: (larger[k], -k))
        late = wave_left is not None and wave_left < PROBE_WAVE_LEFT * (1 + k)
        lead = _at_ceiling(k) / times[k] * times[k_in_force] / _at_ceiling(k_in_force)
        loss = max(1.0 - larger[k] / values[k_in_force], PROBE_LOSS_LEAST) / (1.0 - PROBE_FLOOR)
        loss = loss if lead > 1.0 + jump else 1.0
        if since >= spacing * times[k] * loss and not late and larger[k] >= PROBE_FLOOR * values[k_in_force]:
            return k, (key, [0.0, min(2 * spacing, PROBE_MAX)])
    return k_in_force, (key, [since + times[k_in_force], spacing])


def _at_ceiling(k: int) -> float:
    """Expected committed tokens of a K-draft round at PROBE_CEILING acceptance per position."""
    return (1.0 - PROBE_CEILING ** (1 + k)) / (1.0 - PROBE_CEILING)
