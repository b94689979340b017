"""The decode bench: Qwen3-4B geometry, random bf16 weights, greedy, EOS ignored, random-token prompts;
our engine vs the HF transformers peer on the same weights, against the measured roofline.

    python -m engine.bench decode --out DIR [--concurrency 1 8 16 32 64] [--prompt-len 128]
        [--new-tokens 128] [--peer/--no-peer] [--peer-modes compiled eager] [--peer-warmup-cap-s 240]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.bench import roofline
from engine.bench.closed_loop import closed_loop
from engine.bench.common import add_device_args, make_engine, resolve_device, setup_logging, torch_dtype
from engine.bench.decode_report import decode_markdown, summarize
from engine.bench.hw import copy_bandwidth, gemm_rate
from engine.bench.meta import meta_lines, run_meta
from engine.bench.peer import (
    PEER_MODES,
    PeerTimeout,
    as_checkpoint,
    build_hf_model,
    compiled,
    deadline,
    hf_generate,
    time_hf_generate,
)
from engine.bench.report import write_csv, write_json
from engine.config import SamplingParams
from engine.fixture.known.geometry import GEOMETRIES, random_prompts, target_config
from engine.scheduler import Plan

log = logging.getLogger(__name__)


def engine_run(engine, prompts: Sequence[Sequence[int]], c: int, new_tokens: int) -> dict:
    """All c requests submitted at once, run to completion: the wall; step_ms, a decode step's share of
    the wall less the prefill steps (host gaps included); host_step_ms, the median host time of a step
    until its tokens are on the host."""
    res = closed_loop(engine, prompts[:c], c, c, new_tokens)
    decode = [s for s in res.steps if s.plan in (Plan.DECODE.value, Plan.GATED.value)]  # the one-token steps
    prefill_ms = sum(s.total for s in res.steps if s.plan == Plan.PREFILL.value)
    if not decode:  # a one-token run has no decode step
        period_ms = host_ms = target_ms = None
    else:
        period_ms = (res.wall_s * 1e3 - prefill_ms) / len(decode)
        host_ms = statistics.median(s.total for s in decode)
        target_ms = statistics.median(s.phases.get("target", 0.0) for s in decode)
    row = dict(wall_s=res.wall_s, tok_s=res.tok_s, output_tokens=res.output_tokens, decode_steps=len(decode))
    return row | dict(step_ms=period_ms, host_step_ms=host_ms, target_ms=target_ms, prefill_ms=prefill_ms)


def peer_runs(
    model, prompts, concurrency: Sequence[int], new_tokens: int, mode: str, repeats: int, cap_s: float, raw: list
) -> list[dict]:
    """Time the peer in one mode at each concurrency (rows appended to raw, impl "hf" compiled or
    "hf-eager"); returns the warm-ups that failed or ran past cap_s. A failed compiled warm-up ends that
    mode: the next shape would recompile under the same cap."""
    impl = "hf" if mode == "compiled" else "hf-eager"
    for c in concurrency:
        ids = torch.tensor(prompts[:c], device=model.device)
        t0 = time.perf_counter()
        try:
            with deadline(cap_s):
                time_hf_generate(model, ids, new_tokens, mode)  # warm-up: compilation, static cache, graphs
        except (PeerTimeout, RuntimeError, torch.cuda.OutOfMemoryError) as e:  # dynamo/inductor raise RuntimeErrors
            log.warning("peer %s c=%d warm-up failed after %.0f s: %s", mode, c, time.perf_counter() - t0, e)
            return [{"mode": mode, "concurrency": c, "after_s": time.perf_counter() - t0, "error": str(e)[:300]}]
        warmup_s = time.perf_counter() - t0
        for rep in range(repeats):
            wall = time_hf_generate(model, ids, new_tokens, mode)
            row = dict(impl=impl, concurrency=c, repeat=rep, wall_s=wall, tok_s=c * new_tokens / wall)
            row.update(output_tokens=c * new_tokens, warmup_s=warmup_s)
            raw.append(row | dict(compiled=compiled(model) if mode == "compiled" else False))
        log.info("peer %s c=%d: %.0f tok/s (warm-up %.0f s)", mode, c, raw[-1]["tok_s"], warmup_s)
    return []


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True, help="time the HF peer too")
    p.add_argument("--peer-concurrency", type=int, nargs="+", default=None, help="default: --concurrency")
    p.add_argument("--peer-repeats", type=int, default=3)
    p.add_argument("--peer-modes", nargs="+", choices=PEER_MODES, default=list(PEER_MODES))
    cap = "cap on a peer warm-up (compilation) call; 0: none"
    p.add_argument("--peer-warmup-cap-s", type=float, default=240.0, help=cap)
    p.add_argument("--geometry", default="4b", choices=GEOMETRIES, help="4b; tiny/small for quick checks")
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--copy-mib", type=int, default=2048, help="buffer of the bandwidth measurement")
    p.add_argument("--gemm-n", type=int, default=8192, help="n of the n x n x n GEMM-rate measurement")
    p.add_argument("--check-tokens", type=int, default=32, help="greedy tokens compared engine vs peer (c=1)")
    add_device_args(p)
    return p


def agreement(engine, model, prompt: Sequence[int], tokens: int, device: torch.device) -> dict:
    """Do the engine and the peer run the same weights? The relative L2 error of their last-position
    logits for one prompt (bf16: ~1e-2, fp32: ~1e-6), and the leading greedy tokens they agree on
    (random weights tend to repeat a token, so the logits are the sharper check)."""
    ids = torch.tensor([list(prompt)], device=device)
    ours_logits = engine.last_logits(list(prompt))
    with torch.inference_mode():
        theirs_logits = model(input_ids=ids).logits[0, -1].float()
    rel = ((ours_logits - theirs_logits).norm() / theirs_logits.norm()).item()
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    ours = engine.generate([list(prompt)], greedy)[0].token_ids
    theirs = hf_generate(model, ids, tokens, "eager")[0].tolist()  # eager: no compile for this shape
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), tokens)
    return {"logits_rel_err": rel, "tokens": tokens, "agree_prefix": same, "engine": ours, "peer": theirs}


def peer_compiled(raw: Sequence[dict]) -> str:
    rows = [r for r in raw if r["impl"] == "hf"]
    if not rows:
        return "not run"
    warm = ", ".join(f"c={r['concurrency']} {r['warmup_s']:.0f} s" for r in rows if r["repeat"] == 0)
    return ("compiled" if all(r["compiled"] for r in rows) else "NOT compiled on this device") + f"; warm-ups {warm}"


def write_report(args, argv, config: dict, device, dtype, ceilings: tuple[float, float], raw, failures, agree) -> str:
    """Write decode_runs.csv, decode_summary.csv, decode.md and decode.json from the runs so far;
    returns the notes and the table."""
    bw, rate = ceilings
    P, N = args.prompt_len, args.new_tokens
    summary = summarize(raw, config, args.concurrency, P, N, bw, rate, dtype.itemsize)
    meta = run_meta("decode", device, list(argv) if argv is not None else None)
    hw = dict(copy_bandwidth_Bps=bw, gemm_flops=rate, dtype=str(dtype).removeprefix("torch."))
    hw.update(weight_bytes=roofline.weight_bytes(config, dtype.itemsize))
    hw.update(kv_bytes_per_token=roofline.kv_bytes_per_token(config, dtype.itemsize))
    notes = (
        f"- measured copy bandwidth {bw / 1e12:.2f} TB/s (read + write), {hw['dtype']} GEMM {rate / 1e12:.1f} TFLOP/s "
        f"(n={args.gemm_n}); weights {hw['weight_bytes'] / 1e9:.3f} GB (tied head once), KV "
        f"{hw['kv_bytes_per_token']:,} B/token\n"
        f"- prompts {P} random tokens, {N} new tokens, greedy, EOS ignored; peer: transformers generate, "
        f"static cache; 'HF' = its default compilation ({peer_compiled(raw)}), 'HF eager' = disable_compile\n"
    )
    for f in failures:
        notes += f"- peer {f['mode']} c={f['concurrency']}: warm-up failed after {f['after_s']:.0f} s: {f['error']}\n"
    if agree:
        notes += (
            f"- engine vs peer on the first prompt: last-position logits rel. L2 error "
            f"{agree['logits_rel_err']:.2e}; greedy tokens agree {agree['agree_prefix']}/{agree['tokens']}\n"
        )
    table = decode_markdown(summary)
    write_csv(args.out / "decode_runs.csv", raw)
    write_csv(args.out / "decode_summary.csv", summary)
    (args.out / "decode.md").write_text(f"# Decode bench: {args.geometry}\n\n{meta_lines(meta)}{notes}\n{table}")
    record = dict(geometry=config, hw=hw, prompt_len=P, new_tokens=N, agreement=agree, peer_failures=failures)
    write_json(args.out / "decode.json", {**meta, **record, "summary": summary})
    return notes + "\n" + table


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.prompt_len < 1 or args.new_tokens < 2 or args.repeats < 1 or min(args.concurrency) < 1:
        raise SystemExit("need --prompt-len >= 1, --new-tokens >= 2, --repeats >= 1, concurrency >= 1")
    device = resolve_device(args.device)
    dtype = torch_dtype(args.dtype, device)
    config = target_config(args.geometry)
    peer_conc = (args.peer_concurrency or args.concurrency) if args.peer else []
    P, N = args.prompt_len, args.new_tokens

    model = build_hf_model(config, device, dtype, args.std, args.seed)
    ckpt = as_checkpoint(model, config, f"random-{args.geometry}")
    engine = make_engine(ckpt, None, args, device, max_num_seqs=max(args.concurrency), seq_tokens=P + N)
    bw, rate = copy_bandwidth(device, args.copy_mib << 20), gemm_rate(device, args.gemm_n, dtype)  # once it fits
    log.info("measured: copy %.2f TB/s (read + write), GEMM %.1f TFLOP/s", bw / 1e12, rate / 1e12)
    prompts = random_prompts(max([*args.concurrency, *peer_conc]), P, config["vocab_size"], args.seed)

    raw: list[dict] = []
    for c in args.concurrency:
        engine_run(engine, prompts, c, N)  # warm-up: graph capture and Triton compiles stay out
        for rep in range(args.repeats):
            raw.append({"impl": "pegaspec", "concurrency": c, "repeat": rep, **engine_run(engine, prompts, c, N)})
        log.info("engine c=%d: %.0f tok/s", c, statistics.median(r["tok_s"] for r in raw[-args.repeats :]))
    failures: list[dict] = []
    report = lambda agree=None: write_report(args, argv, config, device, dtype, (bw, rate), raw, failures, agree)  # noqa: E731
    report()  # the engine's figures are on disk before the peer starts (its compilation may run long)
    for mode in args.peer_modes if args.peer else []:
        failures += peer_runs(model, prompts, peer_conc, N, mode, args.peer_repeats, args.peer_warmup_cap_s, raw)
        report()
    agree = None
    if args.peer and args.check_tokens:
        agree = agreement(engine, model, prompts[0], min(N, args.check_tokens), device)
    print(report(agree))
    print(f"wrote {args.out}/decode_runs.csv, decode_summary.csv, decode.md, decode.json")
    return 0
