"""The study's tables: τ observed vs modelled, the cost model's prediction beside each measured arm,
the best arm per concurrency and profile, the echo / lossless / step-time checks, the seed's L20 rows."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence

from engine.bench.arms import NOISE_ARM, PLAIN, SPEC_NOISE_ARM, Arm, arm_drafts, parse_arm
from engine.bench.meta import meta_lines
from engine.bench.plots import sweep_plot
from engine.bench.policy_report import adaptive_markdown, adaptive_rows, paired
from engine.bench.profile import mark_over, profile_markdown
from engine.bench.report import fmt, markdown_table, pct, write_csv, write_json
from engine.bench.study.draws import StudyDraws, replay_check
from engine.bench.study.fit import PREDICTION_BAR, calibration_markdown, prediction_markdown, round_markdown
from engine.bench.study.model import StepCosts, committed_pmf, truncated_tau
from engine.bench.study.sim import RequestSpans, simulate_closed_loop
from engine.bench.summary import summarize
from engine.fixture.known.modelled import AcceptanceProfile
from engine.policy.costs import expected_committed
from engine.policy.span import SpanPolicy

TAU_SIGMAS = 3.0  # τ agrees with the model when within this many standard errors
PREDICT_SEEDS = 16  # replays per predicted cell

log = logging.getLogger(__name__)

L20 = """The seed's L20 study (one L20, Qwen3-4B, DFlash block 7, 64 ShareGPT prompts, 128 output tokens):

| | c32 | c64 |
|---|---:|---:|
| plain decode | 1,974 tok/s | 3,263 tok/s |
| DFlash, no lever | −6.5 % | −35 % |
| DFlash + trim K=4 | +2 % | −26 % |
| DFlash + gate | −5.8 % | −5.5 % |
"""

MODELLED = """**What is modelled and what is real.** Modelled: where the first wrong draft falls. Each
request-round draws it from the profile's per-position conditional acceptance (seeded, and shared by
the arms: a prompt at one position draws the same in every arm; `#` duplicates draw apart); the drafts
before it are the known continuation, the one at it is a wrong token. Real: every forward (the
Qwen3-4B-geometry target, bf16, 36 layers; the z-lab DFlash-4B-shaped drafter's block forward every
round, its proposals then overwritten in place), every byte read and written, the verification and
acceptance on the device, the KV and the scheduling. The target's weights are chosen so its greedy
continuation is known (each step repeats the last prompt token); its step time is the random 4B
weights' (table below), so the costs are the geometry's.
"""


def predict(
    costs: StepCosts,
    c: int,
    arm: Arm,
    profile: AcceptanceProfile,
    args,
    waves: int,
    buckets: Sequence[int],
    seeds: int = PREDICT_SEEDS,
    draws: StudyDraws | None = None,
    rounds: Sequence[int] = (),
) -> float | None:
    """The cost model's tok/s for one arm-run of the sweep: the median over `seeds` replays, or with
    the study's draws over replays of the measured `rounds` on them; None where the table or the
    calibration lacks a point (the benchmarks README, "study")."""
    drafts = arm_drafts(arm, len(profile.conditional))

    def policy() -> SpanPolicy | RequestSpans | None:
        if arm.per_request:  # under graphs (buckets) its chooser values a ragged verify's padded rows, as the engine's
            spans = RequestSpans(costs.table, len(profile.conditional), profile.conditional, arm.trim, arm.gate)
            spans.padded = bool(buckets)
            return spans
        if not arm.adaptive:
            return None
        policy = SpanPolicy(costs.table, len(profile.conditional))
        policy.conditional = list(profile.conditional)
        return policy

    runs = [{"seed": args.seed + i} for i in range(1 if drafts is None else seeds)]  # plain replays draw nothing
    known = [draws.accepted(profile.name, arm.label, r * waves * c) for r in rounds] if draws and drafts else []
    if known and None not in known:
        runs = [{"seed": args.seed + r, "accepted": a} for r, a in zip(rounds, known, strict=True)]
    try:
        return statistics.median(
            simulate_closed_loop(
                *(costs, c, waves * c, args.new_tokens, drafts, profile.conditional, arm.gate, buckets),
                policy=policy(),
                classes=profile.rates(),
                **run,
            ).tok_s
            for run in runs
        )
    except ValueError as err:
        log.warning("no prediction for %s at c=%d: %s", arm.label, c, err)
        return None


def predicted_seconds(costs: StepCosts, c: int, arms, profiles, args, waves: int, buckets: Sequence[int]) -> float:
    """Predicted wall of one (c, every profile) sweep: warm-up + measured rounds of every arm."""
    total = 0.0
    for profile in profiles:
        for arm in arms:
            tok_s = predict(costs, c, arm, profile, args, waves, buckets, seeds=1)  # a weight: one replay
            total += waves * c * args.new_tokens / tok_s if tok_s else 1.0
    return total * (args.rounds + 1)


def tau_model(profile: AcceptanceProfile, drafts: int, new_tokens: int, rounds: int) -> tuple[float, float]:
    """(τ the model gives over a request's rounds, its standard error over `rounds` request-rounds)."""
    pmf = committed_pmf(profile.conditional, drafts)
    mean = expected_committed(profile.conditional, drafts)
    var = sum(p * (n + 1) ** 2 for n, p in enumerate(pmf)) - mean**2
    return truncated_tau(profile.conditional, drafts, new_tokens - 1), math.sqrt(var / max(rounds, 1))


def annotate(
    summary: list[dict],
    profile: AcceptanceProfile,
    costs,
    args,
    waves_for,
    buckets,
    draws: StudyDraws | None = None,
    rounds: dict[tuple[int, str], list[int]] | None = None,
) -> None:
    """Add predicted tok/s (and its ratio to the measured), τ modelled vs observed; rounds: the measured
    rounds per (c, arm)."""
    plain_pred: dict[int, float] = {}
    for s in summary:
        arm, c = parse_arm(s["arm"]), s["concurrency"]
        s["profile"] = profile.name
        ran = (rounds or {}).get((c, s["arm"]), [])
        s["predicted_tok_s"] = predict(costs, c, arm, profile, args, waves_for(c), buckets, draws=draws, rounds=ran)
        pred = s["predicted_tok_s"]
        s["predicted_vs_measured"] = pred / s["tok_s"] if pred and s["tok_s"] else None
        if s["arm"] == PLAIN:
            plain_pred[c] = pred
        s["predicted_ratio"] = pred / plain_pred[c] if pred and plain_pred.get(c) else None
        drafts, hist = arm_drafts(arm, len(profile.conditional)), s["accept_hist"]
        if drafts is None or arm.adaptive or profile.classes or not sum(hist or [0]) or (arm.gate and c >= arm.gate):
            s["tau_model"] = s["tau_se"] = s["tau_agrees"] = None
            continue
        s["tau_model"], s["tau_se"] = tau_model(profile, drafts, args.new_tokens, sum(hist))
        s["tau_agrees"] = abs(s["tokens_per_round"] - s["tau_model"]) <= TAU_SIGMAS * s["tau_se"] + 1e-9


def best_arms(summary: Sequence[dict]) -> list[list]:
    """Per c: the measured best arm (median tok/s; noise arms excluded) and the predicted best."""
    out = []
    for c in sorted({s["concurrency"] for s in summary}):
        cand = [s for s in summary if s["concurrency"] == c and s["arm"] not in (NOISE_ARM, SPEC_NOISE_ARM)]
        meas = max(cand, key=lambda s: s["tok_s"])
        pred = max(cand, key=lambda s: s["predicted_tok_s"] or 0.0)
        out.append([c, meas["arm"], pct(meas["ratio_median"]) if meas["arm"] != PLAIN else "—", meas["verdict"]])
        out[-1] += [pred["arm"], pct(pred["predicted_ratio"]) if pred["arm"] != PLAIN else "—"]
    return out


def profile_table(summary: Sequence[dict]) -> str:
    rows = []
    for s in summary:
        noise = "—" if s["noise_floor"] is None else f"±{100 * s['noise_floor']:.1f} %"
        tau = "—"
        if s.get("tau_model") is not None:
            mark = "" if s["tau_agrees"] else " ✗"
            tau = f"{s['tokens_per_round']:.2f} / {s['tau_model']:.2f} ± {s['tau_se']:.2f}{mark}"
        elif s["tokens_per_round"] is not None:
            tau = f"{s['tokens_per_round']:.2f} / —"
        gap = s["predicted_vs_measured"]
        plain = s["arm"] == PLAIN
        ratio = ("—", "—") if plain else (pct(s["ratio_median"]), f"{pct(s['ratio_min'])} … {pct(s['ratio_max'])}")
        miss = "—" if gap is None else f"{pct(gap)}{'' if abs(gap - 1) <= PREDICTION_BAR else ' ✗'}"
        row = [s["concurrency"], s["arm"], fmt(s["tok_s"], 0), *ratio, noise, s["verdict"], tau]
        rows.append([*row, fmt(s["predicted_tok_s"], 0), miss, s["rounds"]])
    header = ["c", "arm", "tok/s", "vs plain", "round range", "noise", "verdict", "τ obs / model ± se"]
    return markdown_table([*header, "predicted tok/s", "pred vs meas", "rounds"], rows) + "\n"


def policies_markdown(rows: Sequence[dict], summary: Sequence[dict]) -> str:
    """Per c: the best static arm, the uniform adaptive arm and the per-request budget arm, tok/s median
    (least … most over rounds); budget over adaptive (paired over rounds) beside the cost model's, budget
    over the best static ('' without both policy arms)."""
    arms = [s["arm"] for s in summary if "#" not in s["arm"] and parse_arm(s["arm"]).adaptive]
    uni, per = (next((a for a in arms if parse_arm(a).per_request == each), None) for each in (False, True))
    pred, table = {(s["concurrency"], s["arm"]): s["predicted_tok_s"] for s in summary}, []
    for g in adaptive_rows(rows, summary, per) if uni and per else []:
        c, best = g["concurrency"], g["best_static"]
        tok = [[r["tok_s"] for r in rows if (r["concurrency"], r["arm"]) == (c, a)] for a in (best, uni, per)]
        gain = pred[c, per] / pred[c, uni] if pred[c, per] and pred.get((c, uni)) else None
        row = [c, best, *(f"{statistics.median(t):,.0f} ({min(t):,.0f} … {max(t):,.0f})" for t in tok if t)]
        row += [pct(paired(rows, c, per, uni)), pct(gain), pct(g["vs_best"]), f"±{100 * g['noise']:.1f} %"]
        table += [row] if tok[1] else []
    header = ["c", "best static", "its tok/s", f"`{uni}` tok/s", f"`{per}` tok/s", "budget / adaptive", "predicted"]
    text = "Per-request spans against one K (tok/s: median, least … most over rounds):\n\n"
    return text + markdown_table([*header, "budget / best static", "noise"], table) + "\n\n" if table else ""


def checks_markdown(costs: dict[str, list[dict]], echo: dict | None, lossless: list[dict] | None) -> str:
    equality = costs["random"]
    known = {r["batch"]: r["ms"] for r in costs["plain"] if r["kind"] == "verify" and r["span"] == 1}
    rows = [
        [b, fmt(r["ms"], 3), fmt(known.get(b), 3), pct(known[b] / r["ms"]) if b in known else "—"]
        for b, r in sorted((r["batch"], r) for r in equality)
    ]
    text = "Plain step (one-row span per request, graph replay, ms): known-continuation vs random 4B weights\n\n"
    text += markdown_table(["batch", "random (std 0.02)", "known", "known vs random"], rows) + "\n\n"
    if echo is None or lossless is None:
        return text + "Echo and lossless checks: not in this run's files (checks.json).\n"
    verdict = "every" if not echo["failures"] else f"{len(echo['failures'])} failures:"
    text += f"Echo check: {echo['prompts']} prompts, {echo['steps']} greedy steps each: {verdict} output token "
    text += "is its prompt's last token.\n\n" if not echo["failures"] else f"{echo['failures'][:5]}\n\n"
    text += "Lossless check (modelled drafter, each arm's greedy outputs against the known continuation):\n\n"
    text += markdown_table(
        ["arm", "requests", "compared tokens", "mismatches"],
        [[r["arm"], r["requests"], r["compared_tokens"], r["mismatches"]] for r in lossless],
    )
    return text + "\n"


def write_study(
    args, meta, profiles, arms, rows, profiled, echo, lossless, costs, waves_for, buckets, draws=None
) -> list[dict]:
    """study.md, study.json, sweep.csv, summary.csv and a sweep PNG per profile under args.out.
    profiled: the profile rows by engine; costs: what the predictions replay on; draws: the drafter's
    own (None: the replay draws its own). Returns the summary rows."""
    profile_rows = profiled["spec"]
    out = args.out
    labels = [a.label for a in arms]
    title = "# The lever study: Qwen3-4B geometry, known continuation, modelled drafter"
    summaries, text, checked = [], [f"{title}\n\n{meta_lines(meta)}\n"], [0, 0]
    text += [MODELLED, "\n", checks_markdown(profiled, echo, lossless), "\n"]
    for profile in profiles:
        mine = [r for r in rows if r["profile"] == profile.name]
        summary = summarize(mine, labels, args.parity_bar)
        rounds: dict[tuple[int, str], list[int]] = {}
        for r in mine:
            rounds.setdefault((r["concurrency"], r["arm"]), []).append(r["round"])
        annotate(summary, profile, costs, args, waves_for, buckets, draws, rounds)
        if draws:
            same, total = replay_check(mine, profile, args, waves_for, draws)
            checked = [checked[0] + same, checked[1] + total]
        summaries += summary
        cond = ", ".join(f"{a:.3f}" for a in profile.conditional)
        mixed = f"{len(profile.classes)} request classes, one a request: {', '.join(c.name for c in profile.classes)}; "
        text.append(f"## Profile `{profile.name}` ({mixed if profile.classes else ''}")
        text.append(f"{'pooled ' if profile.classes else ''}conditional acceptance by position: {cond})\n\n")
        if skipped := [c for c in args.concurrency if not any(r["concurrency"] == c for r in mine)]:
            text.append(f"Not measured (no round: the time budget left none, or the run ended): c = {skipped}.\n\n")
        text.append(profile_table(summary))
        text.append(f"\nBest arm per c (`{profile.name}`):\n\n")
        header = ["c", "measured best", "vs plain", "verdict", "predicted best", "predicted vs plain"]
        text.append(markdown_table(header, best_arms(summary)) + "\n\n")
        text.append(adaptive_markdown(mine, summary) + policies_markdown(mine, summary))
        png = out / f"sweep-{profile.name.replace(':', '-').replace('/', '-')}.png"
        if summary:  # a profile the sweep never reached has no plot
            sweep_plot(summary, labels, png, f"{profile.name}: {meta['command']}")
    fit_text, fit = prediction_markdown(summaries)
    replay = "seeded draws from the profile"
    if draws:
        replay = "the modelled drafter's own draws, per measured round (replayed on them, {} of {} static "
        replay = replay.format(*checked) + "speculative runs took the engine's prefill, speculative and gated steps)"
    text += ["## The cost model\n\n", fit_text, f"\nThe replays draw {replay}. ", round_markdown(rows, summaries)]
    text += ["\n", calibration_markdown(costs), "\n"]
    mark_over(profile_rows, 1.2)
    text += [L20, "\n## The cost profile (known-continuation target + DFlash-4B drafter)\n\n"]
    text.append(profile_markdown(profile_rows, 1.2))
    write_csv(out / "sweep.csv", rows)
    write_csv(out / "summary.csv", [{**s, "accept_hist": " ".join(map(str, s["accept_hist"]))} for s in summaries])
    (out / "study.md").write_text("".join(text))
    write_json(
        out / "study.json", {**meta, "echo": echo, "lossless": lossless, "prediction": fit, "summary": summaries}
    )
    print("".join(text))
    return summaries
