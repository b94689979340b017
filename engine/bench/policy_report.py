"""The adaptive arm against the static ones, from sweep rows and their summary: per c its paired ratio
to the best static arm and to plain (against the noise floors), its gain over the best single static
setting, and the K it chose."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from engine.bench.arms import PLAIN, SPEC, parse_arm
from engine.bench.report import markdown_table, pct


def _is_static(label: str) -> bool:
    return "#" not in label and not parse_arm(label).adaptive


def static_ratio(summary: Sequence[dict], label: str, c: int) -> float | None:
    """A static arm's median ratio vs plain at c; a gate above c never trips, so that arm is spec there."""
    if label == PLAIN:
        return 1.0
    cell = {(s["concurrency"], s["arm"]): s for s in summary}
    arm = parse_arm(label)
    twin = SPEC + (f"+trim={arm.trim}" if arm.trim else "")  # the arm with its gate off
    s = cell.get((c, label)) or (cell.get((c, twin)) if arm.gate > c else None)
    return s["ratio_median"] if s else None


def best_single_static(summary: Sequence[dict]) -> tuple[str, float] | None:
    """(arm, geometric-mean ratio vs plain over every c) of the static arm with the best one; arms
    missing a concurrency are left out."""
    cs = sorted({s["concurrency"] for s in summary})
    best = None
    for label in dict.fromkeys(s["arm"] for s in summary if _is_static(s["arm"])):
        ratios = [static_ratio(summary, label, c) for c in cs]
        if any(r is None or r <= 0 for r in ratios):
            continue
        gmean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        if best is None or gmean > best[1]:
            best = (label, gmean)
    return best


def paired(rows: Sequence[dict], c: int, arm: str, base: str) -> float | None:
    """Median over rounds of arm's tok/s over base's in the same round at c."""
    tok = {(r["round"], r["arm"]): r["tok_s"] for r in rows if r["concurrency"] == c}
    ratios = [v / tok[(rnd, base)] for (rnd, a), v in tok.items() if a == arm and tok.get((rnd, base))]
    return statistics.median(ratios) if ratios else None


def span_counts(rows: Sequence[dict], c: int, arm: str) -> Counter:
    """Rounds per K the policy chose for `arm` at c, pooled over its runs (`span_choices` "K:n ...")."""
    counts: Counter = Counter()
    for r in rows:
        if r["concurrency"] == c and r["arm"] == arm:
            for item in str(r.get("span_choices") or "").split():
                k, _, n = item.partition(":")
                counts[int(k)] += int(n)
    return counts


def _k_cell(counts: Counter) -> str:
    total = sum(counts.values())
    return " · ".join(f"{k}: {100 * n / total:.0f}%" for k, n in sorted(counts.items())) if total else "—"


def adaptive_rows(rows: Sequence[dict], summary: Sequence[dict], arm: str) -> list[dict]:
    """Per c: the adaptive arm vs the best static arm (median tok/s) and vs plain, and its K histogram."""
    single = best_single_static(summary)
    out = []
    for c in sorted({s["concurrency"] for s in summary}):
        mine = next((s for s in summary if s["concurrency"] == c and s["arm"] == arm), None)
        static = [s for s in summary if s["concurrency"] == c and _is_static(s["arm"])]
        if mine is None or not static:
            continue
        best = max(static, key=lambda s: s["tok_s"])
        noise = mine["noise_floor"] or 0.0
        vs_best = paired(rows, c, arm, best["arm"])
        vs_plain = mine["ratio_median"]
        single_ratio = static_ratio(summary, single[0], c) if single else None
        bar = 1.0 - noise - 1e-12  # ok: no worse than the comparison by more than the noise
        row = dict(concurrency=c, arm=arm, best_static=best["arm"], vs_best=vs_best, vs_plain=vs_plain, noise=noise)
        row.update(ok_best=vs_best is not None and vs_best >= bar, ok_plain=vs_plain is not None and vs_plain >= bar)
        row["single"] = single[0] if single else None
        row["vs_single"] = vs_plain / single_ratio if vs_plain and single_ratio else None
        out.append(row | dict(chosen=span_counts(rows, c, arm)))
    return out


def adaptive_markdown(rows: Sequence[dict], summary: Sequence[dict]) -> str:
    """The adaptive arms' section ('' when the sweep ran none)."""
    labels = list(dict.fromkeys(s["arm"] for s in summary if "#" not in s["arm"] and parse_arm(s["arm"]).adaptive))
    if not labels:
        return ""
    single = best_single_static(summary)
    text = ""
    for arm in labels:
        got = adaptive_rows(rows, summary, arm)
        table = [
            [g["concurrency"], g["best_static"], _fmt_ratio(g["vs_best"], g["ok_best"])]
            + [_fmt_ratio(g["vs_plain"], g["ok_plain"]), f"±{100 * g['noise']:.1f} %", _fmt_ratio(g["vs_single"], None)]
            + [_k_cell(g["chosen"])]
            for g in got
        ]
        header = ["c", "best static arm", "vs best static", "vs plain", "noise", "vs best single", "K chosen (rounds)"]
        text += f"`{arm}` against the static arms (✗: below the comparison by more than the noise):\n\n"
        text += markdown_table(header, table) + "\n\n"
        gains = [g["vs_single"] for g in got if g["vs_single"]]
        if single and gains:
            gmean = math.exp(statistics.fmean(math.log(x) for x in gains))
            text += (
                f"Best single static setting over the range: `{single[0]}` (geometric-mean ratio vs plain "
                f"{single[1]:.3f}). `{arm}` against it: geometric mean {pct(gmean)}, "
                f"from {pct(min(gains))} to {pct(max(gains))} over c.\n\n"
            )
    return text


def _fmt_ratio(value: float | None, ok: bool | None) -> str:
    if value is None:
        return "—"
    return pct(value) + (" ✗" if ok is False else "")
