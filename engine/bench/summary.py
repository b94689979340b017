"""Sweep rows -> per (arm, concurrency) summary: median tok/s, paired ratios vs plain from the same
round, the noise floor from the duplicate plain arm, verdicts, acceptance and the step-time split."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from itertools import zip_longest

from engine.bench.arms import NOISE_ARM, PLAIN, SPEC, SPEC_NOISE_ARM, verdict


def add_paired_ratios(rows: list[dict]) -> None:
    """ratio_vs_plain of every row = its tok/s over plain's tok/s in the same (concurrency, round)."""
    plain = {(r["concurrency"], r["round"]): r["tok_s"] for r in rows if r["arm"] == PLAIN}
    for r in rows:
        base = plain.get((r["concurrency"], r["round"]))
        r["ratio_vs_plain"] = r["tok_s"] / base if base else None


def noise_floors(rows: Sequence[dict], noise_arm: str = NOISE_ARM, base: str = PLAIN) -> dict[int, float]:
    """Per concurrency: the largest |noise_arm / base - 1| over rounds (the paired noise of two identical
    arms, from their ratios vs plain in the same round); concurrencies without both arms are absent."""
    ratio = {(r["concurrency"], r["round"], r["arm"]): r.get("ratio_vs_plain") for r in rows}
    floors: dict[int, float] = {}
    for (c, rnd, arm), value in ratio.items():
        ref = ratio.get((c, rnd, base)) if base != PLAIN else 1.0
        if arm == noise_arm and value is not None and ref:
            floors[c] = max(floors.get(c, 0.0), abs(value / ref - 1.0))
    return floors


def arm_floor(arm: str, c: int, plain: dict[int, float], spec: dict[int, float]) -> float | None:
    """The noise a verdict is taken against: plain's for plain arms; for a speculative arm the larger
    of plain's and spec#2's (a speculative arm's spread also carries the prompts' acceptance)."""
    if arm.startswith(PLAIN) or c not in spec:
        return plain.get(c)
    return max(plain.get(c, 0.0), spec[c])


def _pooled_hist(group: Sequence[dict]) -> list[int]:
    hists = [[int(x) for x in str(r["accept_hist"]).split()] for r in group if r.get("accept_hist")]
    return [sum(column) for column in zip_longest(*hists, fillvalue=0)]


def median_of(group: Sequence[dict], key: str) -> float | None:
    values = [r[key] for r in group if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(rows: Sequence[dict], arms: Sequence[str], bar: float = 0.0) -> list[dict]:
    """One dict per (concurrency, arm) in concurrency-then-arm order."""
    floors, spec_floors = noise_floors(rows), noise_floors(rows, SPEC_NOISE_ARM, SPEC)
    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["concurrency"], r["arm"])].append(r)
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        for arm in arms:
            g = groups.get((c, arm))
            if not g:
                continue
            ratios = [r["ratio_vs_plain"] for r in g if r.get("ratio_vs_plain") is not None]
            med = statistics.median(ratios) if ratios else None
            if arm == PLAIN:
                call = "baseline"
            elif arm in (NOISE_ARM, SPEC_NOISE_ARM):
                call = "noise"
            else:
                call = verdict(med, arm_floor(arm, c, floors, spec_floors), bar) if med is not None else "—"
            rounds = sum(r["request_rounds"] for r in g)
            gated = sum(r["gated_rounds"] for r in g)
            spec_rounds = rounds - gated
            steps_ms = sum(r["steps_ms"] for r in g) or 1.0
            peaks = [r["peak_mem_gib"] for r in g if r.get("peak_mem_gib") is not None]
            tau = (sum(r["committed_tokens"] for r in g) - gated) / spec_rounds if spec_rounds else None
            s = dict(concurrency=c, arm=arm, rounds=len(g), tok_s=statistics.median(r["tok_s"] for r in g))
            s.update(ratio_median=med, ratio_min=min(ratios) if ratios else None)
            s.update(ratio_max=max(ratios) if ratios else None, noise_floor=arm_floor(arm, c, floors, spec_floors))
            s.update(verdict=call, tokens_per_round=tau, gated_share=gated / rounds if rounds else None)
            s.update(mean_batch=median_of(g, "mean_batch"), accept_hist=_pooled_hist(g))
            s.update({f"{k}_share": sum(r[f"{k}_ms"] for r in g) / steps_ms for k in ("draft", "target", "other")})
            out.append(s | dict(peak_mem_gib=max(peaks) if peaks else None))
    return out


def _hist_cell(hist: Sequence[int]) -> str:
    total = sum(hist)
    if not total:
        return "—"
    return " · ".join(f"{n}: {100 * v / total:.0f}%" for n, v in enumerate(hist) if v)


def sweep_markdown(summary: Sequence[dict], bar: float) -> str:
    from engine.bench.report import fmt, markdown_table, pct

    main = []
    for s in summary:
        lo, hi = s["ratio_min"], s["ratio_max"]
        rng = "—" if lo is None or s["arm"] == PLAIN else f"{pct(lo)} … {pct(hi)}"
        noise = "—" if s["noise_floor"] is None else f"±{100 * s['noise_floor']:.1f} %"
        split = f"{100 * s['draft_share']:.0f} / {100 * s['target_share']:.0f} / {100 * s['other_share']:.0f}"
        gated = "—" if s["gated_share"] is None or s["arm"].startswith(PLAIN) else f"{100 * s['gated_share']:.0f} %"
        vs_plain = "—" if s["arm"] == PLAIN else pct(s["ratio_median"])
        row = [s["concurrency"], s["arm"], fmt(s["tok_s"], 0), vs_plain, rng, noise, s["verdict"]]
        main.append(
            [*row, fmt(s["tokens_per_round"], 2), gated, fmt(s["mean_batch"], 1), split, fmt(s["peak_mem_gib"], 2)]
        )
    header = ["c", "arm", "tok/s", "vs plain", "round range", "noise", "verdict", "τ", "gated", "batch"]
    header += ["draft/target/other %", "peak GiB"]
    acc = [
        [s["concurrency"], s["arm"], sum(s["accept_hist"]), _hist_cell(s["accept_hist"])]
        for s in summary
        if sum(s["accept_hist"] or [0])
    ]
    text = markdown_table(header, main) + "\n"
    text += (
        f"\nvs plain: median over rounds of the per-round paired ratio (same round, same concurrency); noise: the "
        f"largest |plain#2/plain − 1| over rounds (speculative arms, with spec#2: the larger of that and "
        f"|spec#2/spec − 1|); verdict parity when |median − 1| ≤ max(noise, {100 * bar:.1f} %). "
        "τ: committed tokens per speculating request-round (accepted drafts + 1). batch: requests per "
        "decode-side step (median over rounds): a speculative arm's scattered finishes drain the batch that "
        "plain keeps full in lockstep.\n"
    )
    if acc:
        text += "\nAccepted drafts per speculating request-round (share of rounds):\n\n"
        text += markdown_table(["c", "arm", "request-rounds", "accepted n: share"], acc) + "\n"
    return text
