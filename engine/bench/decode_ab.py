"""The decode dispatch A/B, interleaved: two engines on one set of random weights, one run under the
previous dispatch (kernel_ab.unfused_mlp: gate|up, then silu_and_mul, at every row count) and one
under the current (SwiGLU in gate|up's epilogue up to mlp.GLU_MAX_ROWS rows); per concurrency the
repeats alternate the two (the first arm rotating), so a machine whose speed drifts during the
call moves both arms alike. At a8d8ca0 the "before" run last in the
same call measured 343 tok/s at c=1 against the "after"'s 311, while the per-op A/B had the after
faster: an order confound this bench removes.

    python -m engine.bench.decode_ab --out DIR [--concurrency 1 64] [--repeats 6]

Writes DIR/decode_ab.csv (one row per run) and decode_ab.md: per c each arm's median tok/s, decode
step and device ms, and the median (min … max) of the paired ratio after / before (same repeat).
`--before-tables JSON` / `--after-tables JSON` run that arm as the current dispatch under another
tuned table (a retune's A/B: the shipped table against a sweep's DIR/tuned/<device>.json).
`--before-set` / `--after-set NAME=VALUE ...` run that arm as the current dispatch with these
module constants set (NAME `module.CONSTANT` of engine.kernels or else of engine, VALUE a Python
literal), with or without its table: e.g. `--after-set attention.SPLIT_TARGET_PROGRAMS_PER_SM=4`,
`--before-set decode_overlap.GROW_AHEAD=False`.
`--before-engine` / `--after-engine NAME=VALUE ...` build that arm's engine with these EngineConfig
fields (the dispatch as the current one unless said otherwise): e.g. `--before-engine
decode_overlap=False`, the host's work between steps against it under the next step's.
`--stagger N` shortens prompt i by i mod N tokens, so the batch's requests cross KV block boundaries at
N different steps (with N = the block size some request grows in every step, as in serving).
`--known-pair` runs both arms on the known-continuation target and the geometry's random DFlash
drafter (engine/bench/known_pair.py), for arms with a drafter: e.g. both with `levers={'max_batch': 1}`
(every round a gated one-token round) and one with `decode_overlap=False`.
`--profile-kernels C ...` then profiles one closed loop per arm at each C (torch.profiler, steps.py):
each kernel's calls and device µs per step, both arms side by side, in kernels.csv and the Markdown.
`--verify-batches B ...` then times the verify forward at B x `--verify-spans` rows under both arms
(verify_ab.py), in verify_ab.csv and the Markdown: the speculative rounds' target spans.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from engine.bench.ab_arms import ARMS, arms_from_args
from engine.bench.common import add_device_args, make_engine, random_prompts, resolve_device, setup_logging, torch_dtype
from engine.bench.decode import engine_run
from engine.bench.geometry import GEOMETRIES, target_config
from engine.bench.known_pair import known_pair
from engine.bench.meta import meta_lines, run_meta
from engine.bench.peer import as_checkpoint, build_hf_model
from engine.bench.report import markdown_table, write_csv, write_json
from engine.bench.steps import profile_arm
from engine.bench.verify_ab import verify_markdown, verify_rows
from engine.models.config import DFlashConfig


def interleaved(runs: dict, concurrency: Sequence[int], repeats: int, run) -> list[dict]:
    """Rows of run(arm, c) for every c, repeat and arm, the arms alternating with a rotating start."""
    rows = []
    for c in concurrency:
        for arm in runs:
            with runs[arm]():
                run(arm, c)  # warm-up: graph capture under the arm's dispatch
        names = list(runs)
        for rep in range(repeats):
            for arm in names[rep % 2 :] + names[: rep % 2]:
                with runs[arm]():
                    rows.append({"arm": arm, "concurrency": c, "repeat": rep, **run(arm, c)})
    return rows


def summary(rows: Sequence[dict]) -> list[dict]:
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        mine = {arm: [r for r in rows if r["concurrency"] == c and r["arm"] == arm] for arm in ARMS}
        ratios = [a["tok_s"] / b["tok_s"] for b, a in zip(mine["before"], mine["after"], strict=True)]
        cell = {"concurrency": c, "after_over_before": statistics.median(ratios)}
        cell |= {"ratio_min": min(ratios), "ratio_max": max(ratios)}
        for arm, runs in mine.items():
            cell[f"{arm}_tok_s"] = statistics.median(r["tok_s"] for r in runs)
            for key in ("step_ms", "target_ms"):
                values = [r[key] for r in runs if r[key] is not None]
                cell[f"{arm}_{key}"] = statistics.median(values) if values else None
        out.append(cell)
    return out


def markdown(cells: Sequence[dict]) -> str:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:.3f}"

    rows = [
        [
            c["concurrency"],
            f"{c['before_tok_s']:,.0f}",
            f"{c['after_tok_s']:,.0f}",
            f"{c['after_over_before']:.3f} ({c['ratio_min']:.3f} … {c['ratio_max']:.3f})",
            f"{ms(c['before_step_ms'])} / {ms(c['after_step_ms'])}",
            f"{ms(c['before_target_ms'])} / {ms(c['after_target_ms'])}",
        ]
        for c in cells
    ]
    header = ["c", "before tok/s", "after tok/s", "after / before (paired)", "step ms b / a", "device ms b / a"]
    return markdown_table(header, rows)


def kernel_rows(
    engines: dict, prompts: Sequence[Sequence[int]], concurrency: Sequence[int], new_tokens: int, runs: dict = ARMS
) -> list[dict]:
    """Per c, each kernel's calls and device µs per step under each arm's dispatch (runs: arm ->
    context, as in `interleaved`)."""
    rows = []
    for c in concurrency:
        per_arm = {}
        for arm, engine in engines.items():
            with runs[arm]():
                per_arm[arm] = {
                    k["name"]: k for k in profile_arm(engine, prompts[:c], c, new_tokens, top=40)["kernels"]
                }
        for name in sorted(
            set().union(*per_arm.values()),
            key=lambda n: -max(a.get(n, {}).get("ms_per_step", 0) for a in per_arm.values()),
        ):
            row = {"concurrency": c, "kernel": name}
            for arm, kernels in per_arm.items():
                k = kernels.get(name, {"calls_per_step": 0.0, "ms_per_step": 0.0})
                row |= {f"{arm}_calls": round(k["calls_per_step"], 2), f"{arm}_us": round(1e3 * k["ms_per_step"], 2)}
            rows.append(row)
    return rows


def kernels_markdown(rows: Sequence[dict]) -> str:
    parts = []
    for c in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == c]
        table = [[r["kernel"], *(f"{r[f'{a}_calls']:g} / {r[f'{a}_us']:.1f}" for a in ARMS)] for r in mine]
        totals = [f"{sum(r[f'{a}_us'] for r in mine):.1f}" for a in ARMS]
        table.append(["**device µs a step (these kernels)**", *totals])
        header = ["kernel", *(f"{a}: calls / µs a step" for a in ARMS)]
        parts.append(f"### Kernels at c={c}\n\n" + markdown_table(header, table))
    note = (
        "Under PDL a kernel launches early and its span includes its wait for the kernel before it, so"
        " a kernel's µs here can hold its predecessor's tail and the columns sum past the step: compare"
        " the arms' totals and calls, not one kernel's time."
    )
    return note + "\n\n" + "\n\n".join(parts) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench.decode_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument(
        "--stagger",
        type=int,
        default=0,
        metavar="N",
        help="prompt i holds prompt-len - (i mod N) tokens: the batch's requests cross KV block boundaries "
        "at N different steps, as requests that arrived apart do (0: every prompt prompt-len long)",
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=6, help="paired repeats per concurrency (each arm once)")
    p.add_argument("--geometry", default="4b", choices=GEOMETRIES)
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--before-tables",
        type=Path,
        default=None,
        metavar="JSON",
        help="the before arm: the current dispatch with this tuned table (a retune's A/B) instead of no deferral",
    )
    p.add_argument(
        "--after-tables", type=Path, default=None, metavar="JSON", help="the after arm with this tuned table"
    )
    for arm in ARMS:
        p.add_argument(
            f"--{arm}-engine",
            nargs="+",
            default=[],
            metavar="FIELD=VALUE",
            help=f"the {arm} arm's engine with these EngineConfig fields (e.g. decode_overlap=False)",
        )
        p.add_argument(
            f"--{arm}-set",
            nargs="+",
            default=[],
            metavar="NAME=VALUE",
            help=f"the {arm} arm: the current dispatch with these engine.kernels constants (module.CONSTANT=literal)",
        )
    p.add_argument(
        "--profile-kernels", type=int, nargs="*", default=[], metavar="C", help="per-kernel profile at these c"
    )
    p.add_argument(
        "--known-pair",
        action="store_true",
        help="the known-continuation target and a random DFlash drafter of the geometry (arms with a drafter)",
    )
    p.add_argument("--verify-batches", type=int, nargs="*", default=[], metavar="B", help="verify forward at these")
    p.add_argument("--verify-spans", type=int, nargs="+", default=[1, 4, 8, 16], metavar="S")
    p.add_argument("--verify-context", type=int, default=256, help="cached tokens per request for the verify")
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if (
        args.repeats < 1
        or min(args.concurrency + args.profile_kernels) < 1
        or args.new_tokens < 2
        or args.prompt_len < 1
        or not 0 <= args.stagger < args.prompt_len
    ):
        raise SystemExit(
            "need --repeats, --concurrency, --profile-kernels and --prompt-len >= 1, --new-tokens >= 2 and "
            "0 <= --stagger < --prompt-len"
        )
    if min(args.verify_batches + args.verify_spans + [args.verify_context]) < 1:
        raise SystemExit("need --verify-batches, --verify-spans and --verify-context >= 1")
    runs, options = arms_from_args(args)
    device = resolve_device(args.device)
    dtype = torch_dtype(args.dtype, device)
    config = target_config(args.geometry)
    if args.known_pair:
        checkpoint, drafter = known_pair(args.geometry, device, dtype, args.seed)
        headroom = DFlashConfig.from_dict(drafter.config).drafts_per_round + 1
    else:
        checkpoint = as_checkpoint(build_hf_model(config, device, dtype, args.std, args.seed), config, "random")
        drafter, headroom = None, 0
    verify_tokens = args.verify_context + max(args.verify_spans) if args.verify_batches else 0
    seq_tokens = max(args.prompt_len + args.new_tokens, verify_tokens)  # decode-only engines as before
    max_c = max(args.concurrency + args.profile_kernels + args.verify_batches)
    engines = {
        arm: make_engine(
            checkpoint,
            drafter,
            args,
            device,
            max_num_seqs=max_c,
            seq_tokens=seq_tokens,
            headroom=headroom,
            options=options[arm],
        )
        for arm in ARMS
    }
    prompts = random_prompts(max_c, args.prompt_len, config["vocab_size"], args.seed)
    prompts = [p[: len(p) - i % args.stagger] for i, p in enumerate(prompts)] if args.stagger else prompts
    rows = interleaved(
        runs, args.concurrency, args.repeats, lambda arm, c: engine_run(engines[arm], prompts, c, args.new_tokens)
    )
    cells = summary(rows)
    meta = run_meta("decode_ab", device, list(argv) if argv is not None else None)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "decode_ab.csv", rows)
    text = f"# Decode dispatch A/B, interleaved: {args.geometry}\n\n{meta_lines(meta)}\n{markdown(cells)}\n"
    if args.profile_kernels:
        krows = kernel_rows(engines, prompts, args.profile_kernels, args.new_tokens, runs)
        write_csv(args.out / "kernels.csv", krows)
        text += "\n" + kernels_markdown(krows)
    if args.verify_batches:
        vrows = verify_rows(engines, runs, args.verify_batches, args.verify_spans, args.verify_context, args.repeats)
        write_csv(args.out / "verify_ab.csv", vrows)
        text += "\n" + verify_markdown(vrows)
    (args.out / "decode_ab.md").write_text(text)
    write_json(args.out / "decode_ab.json", {**meta, "summary": cells})
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
