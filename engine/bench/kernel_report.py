"""What the kernel micro-benchmark writes beyond the CSVs (report.py): the skinny-linear summary
(crossover M, decode-step projection time), and the tuned table built from the sweeps' results
(DIR/tuned/<device>.json, and with --write-tuned engine/kernels/tuned/<device>.json)."""

from __future__ import annotations

import json
import time
from itertools import takewhile

import torch

from engine.bench import kernel_cases as cases
from engine.bench.report import markdown_table
from engine.kernels import tuning
from engine.kernels.tuning import TunedTables


def linear_report(best: dict, ms: list[int], peak: float, state: dict | None = None) -> str:
    out, table, configs, crossover = [], [], {}, {}
    for n, k in cases.SHAPES:
        wbytes = n * k * cases.DTYPE.itemsize
        for m in ms:
            cub_us, tri = best[(n, k, m)]
            if tri is None:
                continue
            _, cfg, us = tri
            gb = lambda t, wb=wbytes: wb / (t * 1e-6) / 1e9
            timed = [f"{t:.1f}|{gb(t):.0f}|{gb(t) / peak:.2f}".split("|") for t in (cub_us, us)]
            table.append([f"{cases.SHAPE_NAMES[(n, k)]} {n}x{k}", m, *timed[0], *timed[1], str(tuple(cfg))])
            table[-1].append(f"{cub_us / us:.2f}x")
            if us < cub_us:  # a tuned shape's missing bucket means cuBLAS (see linear.skinny_config)
                configs.setdefault((n, k), {})[m] = cfg
            elif (n, k) not in crossover:
                crossover[(n, k)] = m
    out.append(f"### Skinny-M linear vs cuBLAS ({cases.DTYPE}; GB/s = weight bytes / time)\n")
    header = ["shape", "M", "cuBLAS us", "GB/s", "frac", "triton us", "GB/s", "frac"]
    out.append(markdown_table([*header, "config (bm,bn,bk,split,warps,stages)", "speedup"], table))
    out.append(
        "\nCrossover (first M where cuBLAS is faster): "
        + ", ".join(f"{cases.SHAPE_NAMES[s]}={crossover.get(s, '>' + str(ms[-1]))}" for s in cases.SHAPES)
    )
    # The decode step of Qwen3-4B: 36 x (qkv, o, gate_up, down) + lm_head, at each M.
    step = {}
    for m in ms:
        weight = lambda s: 1 if cases.SHAPE_NAMES[s] == "lm_head" else cases.LAYERS_4B
        if all(best[(n, k, m)][1] for n, k in cases.SHAPES):
            step[m] = (
                sum(weight(s) * best[(*s, m)][0] for s in cases.SHAPES),
                sum(weight(s) * best[(*s, m)][1][2] for s in cases.SHAPES),
            )
    wins = list(takewhile(lambda m: m in step and step[m][1] < step[m][0], ms))  # triton's leading run of M
    m_max = wins[-1] if wins else 0
    out.append(
        "\nQwen3-4B decode-step projection time (36 layers + lm_head), cuBLAS vs triton (us): "
        + ", ".join(f"M={m}: {c:.0f} vs {t:.0f}" for m, (c, t) in step.items())
    )
    if state is not None:
        state.update(linear_configs=configs, m_max=m_max, linear_ms=list(ms))
    return "\n".join(out)


def _set_buckets(table: dict, shape: tuple[int, int], ms, winners: dict) -> None:
    """table[shape][m] = winners[m] for each measured M, or no entry where nothing won it."""
    per_m = table.setdefault(shape, {})
    for m in ms:
        if m in winners:
            per_m[m] = winners[m]
        else:
            per_m.pop(m, None)


def tuned_from_sweep(state: dict, old: TunedTables, full_ms: bool) -> TunedTables:
    """`old` with every (shape, M bucket) this run measured replaced by its result: the fastest config
    that passed the correctness check where it beat cuBLAS (linear) / the unfused pair (fused),
    else no entry (cuBLAS / the unfused pair serves that bucket)."""
    lin = {shape: dict(per_m) for shape, per_m in old.linear.items()}
    if "linear_best" in state:
        configs = state["linear_configs"]
        for n, k, m in state["linear_best"]:
            _set_buckets(lin, (n, k), [m], configs.get((n, k), {}))
    fused = {shape: dict(per_m) for shape, per_m in old.silu_mul_linear.items()}
    if "fused_configs" in state:
        _set_buckets(fused, cases.DOWN_SHAPE, state["fused_ms"], state["fused_configs"])
    normed = {shape: dict(per_m) for shape, per_m in old.add_rms_norm_linear.items()}
    if "norm_configs" in state:
        for shape in cases.NORM_SHAPES:
            _set_buckets(normed, shape, state["norm_ms"], state["norm_configs"].get(shape, {}))
    m_max = state["m_max"] if "m_max" in state and full_ms else old.m_max
    tables = dict(linear=lin, silu_mul_linear=fused, add_rms_norm_linear=normed)
    limits = dict(m_max=m_max, fused_m_max=old.fused_m_max, norm_m_max=old.norm_m_max)
    return TunedTables(device=old.device, **limits, **tables)


def table_changes(old: TunedTables, new: TunedTables) -> list[str]:
    lines = [f"linear m_max {old.m_max} -> {new.m_max}"] if old.m_max != new.m_max else []
    pairs = (
        ("linear", old.linear, new.linear),
        ("silu_mul_linear", old.silu_mul_linear, new.silu_mul_linear),
        ("add_rms_norm_linear", old.add_rms_norm_linear, new.add_rms_norm_linear),
    )
    for what, a, b in pairs:
        for shape in sorted(set(a) | set(b)):
            pa, pb = a.get(shape, {}), b.get(shape, {})
            for m in sorted(set(pa) | set(pb)):
                if pa.get(m) != pb.get(m):
                    show = lambda c: "cuBLAS/unfused" if c is None else str(tuple(c))
                    lines.append(f"{what} {shape[0]}x{shape[1]} M={m}: {show(pa.get(m))} -> {show(pb.get(m))}")
    return lines


def write_tuned(args, report: list[str], install: bool) -> None:
    """The table from this run to DIR/tuned/<slug>.json, and with `install` also to
    engine/kernels/tuned/<slug>.json (where the kernels read it)."""
    name = torch.cuda.get_device_name()
    old = tuning.load(name)
    base = old if old.source else TunedTables(tuning.device_slug(name))
    new = tuned_from_sweep(args.state, base, args.ms == cases.MS)
    note = (
        f"python -m engine.bench.kernels{' --quick' if args.quick else ''} --write-tuned on {name}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    )
    text = tuning.dumps(new, name, note)
    tuning.parse(json.loads(text))  # what the kernels will read back
    paths = [args.out / "tuned" / f"{tuning.device_slug(name)}.json"] + ([tuning.tuned_path(name)] if install else [])
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    changes = table_changes(old, new)
    where = ", ".join(str(p) for p in paths) + ("" if install else " (not installed: no --write-tuned)")
    report.append(
        f"### Tuned table written: {where}\n\n"
        + (f"Changes against {old.source}:\n" if old.source else "New table (no previous file):\n")
        + "\n".join(f"- {c}" for c in changes or ["(none)"])
        + "\n\n```json\n"
        + text
        + "```\n"
    )
