"""The study over batch x context: the (prompt length, c) grid refused before anything is built where
its largest cell does not fit the memory budget, one run's arguments per prompt length, and the report
across them (the best arm per cell, the crossover c per context and the gate it suggests)."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from pathlib import Path

from engine.bench.arms import ADAPTIVE_ARM, NOISE_ARM, PLAIN, SPEC_NOISE_ARM
from engine.bench.common import plan_pool, seq_blocks
from engine.bench.meta import meta_lines
from engine.bench.report import markdown_table, pct, write_csv


def fit_grid(
    concurrency: Sequence[int], seqs: dict[int, int], headroom: int, per_block: int, budget: tuple[int, str], later: int
) -> int:
    """KV blocks (null block excluded) of the grid's largest (prompt length, c) cell (seqs: tokens a
    request reaches per prompt length), refused (plan_pool) before anything is built where it does not fit."""
    cs = sorted(set(concurrency))
    blocks = {(n, c): seq_blocks(c, t + headroom + 1) for n, t in seqs.items() for c in cs}
    (n, c), most = max(blocks.items(), key=lambda item: item[1])
    grid = f"{sorted(seqs)} prompt tokens x c={cs} (largest cell: {n} x c={c}, {seqs[n]} tokens a request)"
    plan_pool(grid, per_block, most, budget, later)
    return most


class ContextRun:
    """One prompt length of a study: its arguments (files under prompt-N/ when nested), the argv a report
    from its files re-parses, the batches it profiles, its random-weights profile rows."""

    def __init__(
        self, args: argparse.Namespace, prompt_len: int, concurrency: list[int], argv: list[str], nested: bool
    ):
        self.context, self.batches, self.equality = prompt_len, sorted({1, *concurrency}), []
        self.args = copy.copy(args)
        self.args.prompt_len, self.args.prompt_lens, self.args.concurrency = prompt_len, [prompt_len], concurrency
        self.args.out = args.out / f"prompt-{prompt_len}" if nested else args.out
        self.argv = [*argv, "--prompt-len", str(prompt_len), "--prompt-lens", str(prompt_len)] if nested else argv


def best_cells(summaries: dict[int, list[dict]]) -> list[dict]:
    """Per (context, profile, c): the measured best arm (noise arms excluded), its ratio vs plain and
    verdict, and the adaptive arm's ratio."""
    out = []
    for n, summary in sorted(summaries.items()):
        for profile in sorted({s["profile"] for s in summary}):
            for c in sorted({s["concurrency"] for s in summary if s["profile"] == profile}):
                cell = [s for s in summary if s["profile"] == profile and s["concurrency"] == c]
                cand = [s for s in cell if s["arm"] not in (NOISE_ARM, SPEC_NOISE_ARM)]
                best = max(cand, key=lambda s: s["tok_s"])
                adaptive = next((s for s in cell if s["arm"] == ADAPTIVE_ARM), None)
                plain = next(s for s in cell if s["arm"] == PLAIN)
                row = dict(context=n, profile=profile, concurrency=c, plain_tok_s=plain["tok_s"], best=best["arm"])
                row.update(best_tok_s=best["tok_s"], best_ratio=None if best is plain else best["ratio_median"])
                row.update(best_verdict=best["verdict"], adaptive_ratio=adaptive and adaptive["ratio_median"])
                row["spec_wins"] = any(s["verdict"] == "win" for s in cand if s["arm"] != PLAIN)
                out.append(row)
    return out


def crossovers(cells: Sequence[dict]) -> list[list]:
    """Per (context, profile): the least c at which no speculative arm wins (its crossover; None: one wins
    at every measured c) and the gate it suggests (MAX_BATCH: the largest winning c below it)."""
    rows = []
    for key in sorted({(r["context"], r["profile"]) for r in cells}):
        mine = sorted((r for r in cells if (r["context"], r["profile"]) == key), key=lambda r: r["concurrency"])
        cross = next((r["concurrency"] for r in mine if not r["spec_wins"]), None)
        wins = [r["concurrency"] for r in mine if r["spec_wins"] and (cross is None or r["concurrency"] < cross)]
        gate = max(wins) if wins else "— (no win below the crossover)"
        gate = "off (spec wins at every c measured)" if cross is None else gate
        rows.append([*key, "—" if cross is None else cross, gate])
    return rows


def write_contexts(out: Path, meta: dict, summaries: dict[int, list[dict]], concurrency: list[int]) -> None:
    """contexts.csv and contexts.md: the best arm per (context, c, profile) and the crossover per context."""
    cells = best_cells(summaries)
    write_csv(out / "contexts.csv", cells)
    table = [
        [r["context"], r["profile"], r["concurrency"], f"{r['plain_tok_s']:.0f}", r["best"]]
        + [pct(r["best_ratio"]) if r["best_ratio"] else "—", r["best_verdict"], pct(r["adaptive_ratio"])]
        for r in cells
    ]
    text = f"# The lever study over batch x context\n\n{meta_lines(meta)}\nGrid: prompt tokens {sorted(summaries)} "
    text += f"x c={concurrency}; each prompt length's study under prompt-N/.\n\n"
    header = ["prompt tokens", "profile", "c", "plain tok/s", "best arm", "vs plain", "verdict", "adaptive vs plain"]
    text += markdown_table(header, table) + "\n\nCrossover per context (the least c at which no speculative arm wins "
    text += "by more than the noise) and the MAX_BATCH gate it suggests:\n\n"
    text += markdown_table(["prompt tokens", "profile", "crossover c", "MAX_BATCH"], crossovers(cells)) + "\n"
    (out / "contexts.md").write_text(text)
    print(text)
