"""τ against prompt context: the reference speculative loop (engine/fixture/reference.py), greedy, on
windows of held-out corpus files that all end at one cut, so every context continues the same text.

    python -m engine.bench tau-context --pair engine/fixture/data/tiny --contexts 128 512 1024 1912 --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.bench.common import resolve_device, setup_logging
from engine.bench.meta import meta_lines, run_meta
from engine.bench.report import fmt, markdown_table, write_csv, write_json
from engine.fixture.corpus import load_corpus
from engine.fixture.reference import load_pair, ngram_generate, reference_generate
from engine.fixture.tokenizer import load_tokenizer
from engine.shipped import DATA_DIR

log = logging.getLogger(__name__)


def check_contexts(contexts: Sequence[int], new_tokens: int, block: int, limit: int) -> None:
    """ValueError naming the first context under one token or whose last position (context + new tokens
    + the drafter's block, the engine's admission rule) passes the models' position limit."""
    for c in contexts:
        if c < 1:
            raise ValueError(f"context {c}: a prompt needs at least one token")
        if c + new_tokens + block > limit:
            raise ValueError(
                f"context {c} + {new_tokens} new tokens + the drafter's block {block} = {c + new_tokens + block} "
                f"exceeds the models' max_position_embeddings {limit} (longest context: {limit - new_tokens - block})"
            )


def context_prompts(tokenizer_dir: Path, cut: int, n: int, recipe: dict) -> list[tuple[str, list[int]]]:
    """(file, its first `cut` token ids) of the first n held-out files of the recipe's corpus (stdlib, then
    site-packages up to its site_bytes), in sha1 order, that hold `cut` tokens."""
    corpus = load_corpus(recipe["heldout_percent"], site_bytes=recipe["site_bytes"])
    files = sorted(corpus.heldout, key=lambda f: hashlib.sha1(f.key.encode()).hexdigest())
    tok, out = load_tokenizer(tokenizer_dir), []
    for f in files:
        ids = tok.encode(f.text, add_special_tokens=False).ids
        out += [(f.key, ids[:cut])] if len(ids) >= cut else []
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} held-out files hold {cut} tokens ({n} prompts asked)")


def measure(
    pair: Path, contexts: Sequence[int], prompts: int, new_tokens: int, device: torch.device, ngram: bool
) -> list[dict]:
    """One row per (prompt, context) of a fixture build (target/, drafter/, manifest.json): rounds,
    committed, τ, distinct-token ratio of the output, rounds accepting >= j drafts (+ the n-gram
    drafter's τ); a ValueError (check_contexts, context_prompts) before any generation."""
    target, drafter = load_pair(pair / "target", pair / "drafter", device)
    width, block = drafter.cfg.drafts_per_round, drafter.cfg.block_size
    limit = min(target.config.max_position_embeddings, drafter.cfg.geometry.max_position_embeddings)
    check_contexts(contexts, new_tokens, block, limit)
    recipe = json.loads((pair / "manifest.json").read_text())["recipe"]
    rows = []
    for source, ids in context_prompts(pair / "target", max(contexts), prompts, recipe):
        for c in contexts:
            res = reference_generate(target, drafter, ids[-c:], new_tokens)
            acc = [r.accepted for r in res.rounds]
            row = dict(context=c, source=source, rounds=len(acc), committed=sum(r.committed for r in res.rounds))
            row |= dict(tau=res.tau, distinct=len(set(res.tokens)) / len(res.tokens))
            row.update({f"ge{j}": sum(a >= j for a in acc) for j in range(1, width + 1)})
            if ngram:
                row["ngram_tau"] = ngram_generate(target, ids[-c:], new_tokens, width).tau
            log.info("context %d %s: τ %.3f over %d rounds", c, source, res.tau, len(acc))
            rows.append(row)
    return rows


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Per context: τ pooled over rounds, its mean, sd, min and max over prompts, the share of rounds
    accepting >= j drafts (pooled), the mean distinct-token ratio (and n-gram τ, when measured)."""
    out = []
    for c in sorted({r["context"] for r in rows}):
        rs = [r for r in rows if r["context"] == c]
        taus, rounds = [r["tau"] for r in rs], sum(r["rounds"] for r in rs)
        s = dict(context=c, prompts=len(rs), rounds=rounds, tau=sum(r["committed"] for r in rs) / rounds)
        s.update(tau_mean=statistics.mean(taus), tau_sd=statistics.pstdev(taus), tau_min=min(taus), tau_max=max(taus))
        s.update({k: sum(r[k] for r in rs) / rounds for k in rs[0] if k.startswith("ge")})
        s.update({k: statistics.mean(r[k] for r in rs) for k in ("distinct", "ngram_tau") if k in rs[0]})
        out.append(s)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench tau-context", description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path, default=DATA_DIR / "tiny", help="DIR with target/ and drafter/")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 512], help="prompt tokens")
    p.add_argument("--prompts", type=int, default=8, help="held-out files, one prompt each per context")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--ngram", action="store_true", help="also the n-gram drafter's τ (a control: the target's text)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(False)
    try:
        device = resolve_device(args.device)
        rows = measure(args.pair, args.contexts, args.prompts, args.new_tokens, device, args.ngram)
    except ValueError as err:
        raise SystemExit(f"tau-context: {err}") from None
    summary, meta = summarize(rows), run_meta("tau-context", device, None if argv is None else list(argv))
    write_csv(args.out / "tau_context.csv", rows)
    write_csv(args.out / "tau_context_summary.csv", summary)
    write_json(args.out / "meta.json", meta | {"pair": str(args.pair), "new_tokens": args.new_tokens})
    table = markdown_table(list(summary[0]), [[fmt(v, 3) for v in s.values()] for s in summary])
    (args.out / "tau_context.md").write_text(meta_lines(meta) + "\n" + table + "\n")
    log.info("%s", table)
    return 0
