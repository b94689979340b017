"""The adaptive policy's probes (engine/policy/span.py): now and then one round tries a larger K than the
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
    """This round's K and its probe state: the K in force, or the best larger K when its value is at
    least PROBE_FLOOR of the K in force's and the ms under the K in force since the last probe reach the
    spacing times the probe's expected loss: its ms times the share of value it gives up (at least
    PROBE_LOSS_LEAST), scaled so a probe at PROBE_FLOOR waits the spacing times its ms, which is also the
    wait of a probe whose K, at PROBE_CEILING acceptance, leads the K in force by no more than `jump`.
    The spacing doubles up to PROBE_MAX while probes change nothing; it and the ms since a probe are kept
    per (batch bucket, K in force) in `probes` (the caller passes none where the estimate moved K at an
    unchanged batch). No probe at K 0 on a `starved` estimate (it relaxes instead), in a wave whose
    fewest tokens left (`wave_left`) are under PROBE_WAVE_LEFT of its spans, or, out of the gated round,
    for a K that would not beat `gated_bar` (the value per ms the gated round sets) at PROBE_CEILING."""
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
