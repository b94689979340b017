"""PNG plots (matplotlib, headless). A missing matplotlib skips the plot with a warning, never the bench."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    return plt


def sweep_plot(summary: Sequence[dict], arms: Sequence[str], path: Path, title: str) -> bool:
    """Left: output tok/s vs concurrency per arm. Right: median paired ratio vs plain with the round
    range as error bars and the noise band (1 ± noise floor) shaded."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    conc = sorted({s["concurrency"] for s in summary})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(arms):
        pts = [s for s in summary if s["arm"] == arm]
        if not pts:
            continue
        color = colors[i % len(colors)]  # one colour per arm on both panels
        ax1.plot([s["concurrency"] for s in pts], [s["tok_s"] for s in pts], marker="o", label=arm, color=color)
        if arm == "plain":
            continue
        r = [s for s in pts if s["ratio_median"] is not None]
        if r:
            med = [s["ratio_median"] for s in r]
            err = [
                [m - s["ratio_min"] for m, s in zip(med, r, strict=True)],
                [s["ratio_max"] - m for m, s in zip(med, r, strict=True)],
            ]
            ax2.errorbar([s["concurrency"] for s in r], med, yerr=err, marker="o", capsize=3, label=arm, color=color)
    base = [s for s in summary if s["arm"] == "plain" and s["noise_floor"] is not None]
    floors = {s["concurrency"]: s["noise_floor"] for s in base}
    if floors:
        xs = sorted(floors)
        ax2.fill_between(
            xs, [1 - floors[c] for c in xs], [1 + floors[c] for c in xs], color="grey", alpha=0.25, label="noise floor"
        )
    ax2.axhline(1.0, color="black", lw=0.8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [str(c) for c in conc])
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("output tok/s (median over rounds)")
    ax2.set_ylabel("paired ratio vs plain (median, round range)")
    fig.suptitle(textwrap.fill(title, 160), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def profile_plot(rows: Sequence[dict], path: Path, threshold: float, title: str) -> bool:
    """Verify time vs rows (one line per span), points over threshold x the 1-row time marked; drafter
    forward time vs batch on a second axis."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    verify = [r for r in rows if r["kind"] == "verify"]
    for span in sorted({r["span"] for r in verify}):
        pts = sorted((r for r in verify if r["span"] == span), key=lambda r: r["rows"])
        ax1.plot([r["rows"] for r in pts], [r["ms"] for r in pts], marker="o", label=f"span {span}")
    over = [r for r in verify if r["over"]]
    if over:
        style = dict(s=120, facecolors="none", edgecolors="red", label=f"> {threshold}x the 1-row time", zorder=3)
        ax1.scatter([r["rows"] for r in over], [r["ms"] for r in over], **style)
    one = [r["ms"] for r in verify if r["rows"] == 1]
    if one:
        ax1.axhline(threshold * one[0], color="red", ls="--", lw=0.8)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("verify rows = batch x span")
    ax1.set_ylabel("ms per target forward (graph replay)")
    draft = sorted((r for r in rows if r["kind"] == "draft"), key=lambda r: r["batch"])
    if draft:
        ax2.plot([r["batch"] for r in draft], [r["ms"] for r in draft], marker="o", color="purple")
        ax2.set_xscale("log", base=2)
    ax2.set_xlabel("drafter batch")
    ax2.set_ylabel("ms per drafter forward (graph replay)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 160), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
