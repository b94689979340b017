"""The lever sweep end to end on CPU with a tiny random pair: rows, interleaving, pairing, budget."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import pytest
import torch

from engine.bench import sweep
from engine.bench.arms import parse_arms, round_order
from engine.bench.closed_loop import LoadResult, acceptance_histogram, closed_loop, mean_batch, output_lengths
from engine.bench.common import make_engine
from engine.bench.report import read_csv
from engine.engine import SpecStats
from engine.provenance import git_commit

ARMS = ["plain", "spec", "spec+trim=2", "spec+gate=1", "spec+policy=adaptive"]
NEW = 4


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    gen = torch.Generator().manual_seed(0)
    lines = [
        json.dumps({"id": i, "ids": torch.randint(0, 290, (int(n),), generator=gen).tolist(), "source": "random"})
        for i, n in enumerate([5, 7, 6])
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def swept(tiny_target, tiny_drafter, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    argv = ["--target", str(tiny_target), "--drafter", str(tiny_drafter), "--prompts", str(prompts_file)]
    argv += ["--out", str(out), "--concurrency", "1", "2", "--rounds", "2", "--new-tokens", str(NEW)]
    argv += ["--arms", *ARMS, "--noise-arm", "--device", "cpu", "--no-progress"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PEGASPEC_CACHE", str(out / "cache"))  # the adaptive arm calibrates the spec engine
        assert sweep.main(argv) == 0
    return out, read_csv(out / "sweep.csv"), json.loads((out / "sweep.json").read_text())


def test_outputs_and_complete_rows(swept):
    out, rows, meta = swept
    for name in ("sweep.csv", "sweep_summary.csv", "sweep.md", "sweep.json"):
        assert (out / name).is_file()
    assert len(rows) == 2 * 2 * 6  # concurrencies x measured rounds x arms (warm-up discarded)
    for r in rows:
        c = int(r["concurrency"])
        keys = ("tok_s", "wall_s", "ratio_vs_plain", "steps", "draft_ms", "target_ms", "other_ms", "seq", "gc_ms")
        for key in (*keys, "mean_batch"):
            assert r[key] != "", (key, r)
        assert 0 < float(r["prefill_ms"]) <= float(r["other_ms"]) + float(r["target_ms"])  # its 2 waves' prefills
        assert int(r["requests"]) == 2 * c  # two waves of c
        assert int(r["output_tokens"]) == 2 * c * NEW  # fixed length, EOS ignored
        assert int(r["max_in_flight"]) == c
        assert {r["round"] for r in rows} == {"1", "2"}
        if r["arm"].startswith("plain"):  # every decode step but each wave's last launched its successor
            assert int(r["launched_ahead"]) == int(r["decode_steps"]) - 2, r
    assert meta["commit"] == git_commit()  # PEGASPEC_COMMIT on a device copy, else the full hash or None
    assert meta["command"].startswith("python -m engine.bench sweep")
    md = (out / "sweep.md").read_text()
    assert "spec+trim=2" in md and "verdict" in md and meta["device"] in md
    assert "`spec+policy=adaptive` against the static arms" in md and "Best single static setting" in md
    assert len(list((out / "cache" / "costs").glob("*.json"))) == 1  # calibrated once, at its first run


def test_arms_are_interleaved_round_by_round(swept):
    _, rows, _ = swept
    arms = parse_arms(ARMS, noise_arm=True)
    rows = sorted(rows, key=lambda r: int(r["seq"]))
    assert [int(r["seq"]) for r in rows] == list(range(len(rows)))
    blocks = defaultdict(list)
    for r in rows:
        blocks[(r["concurrency"], r["round"])].append(r)
    for (_, rnd), block in blocks.items():
        seqs = [int(r["seq"]) for r in block]
        assert seqs == list(range(seqs[0], seqs[0] + len(arms)))  # one round = one contiguous block
        assert [r["arm"] for r in block] == [a.label for a in round_order(arms, int(rnd))]
        assert [int(r["slot"]) for r in block] == list(range(len(arms)))
    starts = {(c, rnd): b[0]["arm"] for (c, rnd), b in blocks.items()}
    assert starts[("1", "1")] != starts[("1", "2")]


def test_paired_ratios_come_from_the_same_round(swept):
    _, rows, meta = swept
    plain = {(r["concurrency"], r["round"]): float(r["tok_s"]) for r in rows if r["arm"] == "plain"}
    for r in rows:
        expect = float(r["tok_s"]) / plain[(r["concurrency"], r["round"])]
        assert float(r["ratio_vs_plain"]) == pytest.approx(expect, rel=1e-9)
    for c, floor in meta["noise_floors"].items():
        noise = [abs(float(r["ratio_vs_plain"]) - 1) for r in rows if r["arm"] == "plain#2" and r["concurrency"] == c]
        assert floor == pytest.approx(max(noise))
    summary = {(s["concurrency"], s["arm"]): s for s in meta["summary"]}
    for (c, arm), s in summary.items():
        if arm not in ("plain", "plain#2"):
            floor = meta["noise_floors"][str(c)]
            if abs(s["ratio_median"] - 1) <= max(floor, meta["parity_bar"]):
                assert s["verdict"] == "parity"
            else:
                assert s["verdict"] == ("win" if s["ratio_median"] > 1 else "loss")


def test_levers_take_effect_per_arm(swept):
    _, rows, _ = swept
    for r in rows:
        arm, rounds = r["arm"], int(r["request_rounds"])
        if arm.startswith("plain"):
            assert int(r["spec_steps"]) == 0 and int(r["decode_steps"]) > 0 and rounds == 0
        elif arm == "spec+gate=1":  # MAX_BATCH=1 gates every round: one-token verifies only
            assert int(r["gated_rounds"]) == rounds > 0 and int(r["spec_steps"]) == 0
            assert r["accept_hist"] == ""
        elif arm == "spec+policy=adaptive":  # K per round from the policy: one decision per speculative step
            chosen = {int(k): int(n) for k, n in (item.split(":") for item in r["span_choices"].split())}
            assert sum(chosen.values()) == int(r["spec_steps"]) > 0 and set(chosen) <= {0, 1, 2, 4, 5}
            assert int(r["drafts_verified"]) <= 5 * (rounds - int(r["gated_rounds"]))
            terms = dict(item.split(":") for item in r["host_terms"].split())  # what the choices rested on
            assert terms and all(key.split("@")[0] in ("spec", "gated") and float(ms) >= 0 for key, ms in terms.items())
            walls = [item.split(":") for item in r["host_residuals"].split()]  # kind@bucket:n:p50:p90:max
            assert {w[0] for w in walls} <= set(terms) and all(int(w[1]) > 0 for w in walls)
            assert all(0 <= float(w[2]) <= float(w[3]) <= float(w[4]) for w in walls)
            probes = [tuple(map(int, item.split(":"))) for item in r["probes"].split()]  # (batch, K, rounds)
            assert all(1 <= b <= 4 and k in chosen and n <= chosen[k] for b, k, n in probes)
        else:
            assert r["span_choices"] == r["host_terms"] == r["host_residuals"] == r["probes"] == ""
            k = 2 if arm == "spec+trim=2" else 5  # the tiny drafter: block 6, 5 drafts a round
            assert int(r["gated_rounds"]) == 0 and int(r["spec_steps"]) > 0
            assert int(r["drafts_verified"]) <= k * rounds
            hist = [int(x) for x in r["accept_hist"].split()]
            assert sum(hist) == rounds and all(n == 0 for n in hist[k + 1 :])


def test_bad_arm_is_a_clear_cli_error(tiny_target, tiny_drafter, prompts_file, tmp_path):
    argv = ["--target", str(tiny_target), "--drafter", str(tiny_drafter), "--prompts", str(prompts_file)]
    with pytest.raises(SystemExit, match=r"--arms: arm 'spec\+trim=x'"):
        sweep.main([*argv, "--out", str(tmp_path), "--arms", "plain", "spec+trim=x", "--device", "cpu"])
    with pytest.raises(SystemExit, match="spec arms need --drafter"):
        sweep.main(
            [
                "--target",
                str(tiny_target),
                "--prompts",
                str(prompts_file),
                "--out",
                str(tmp_path),
                "--arms",
                "spec",
                "--device",
                "cpu",
            ]
        )


def test_time_budget_trims_rounds_not_concurrencies(tiny_target, tiny_drafter):
    args = argparse.Namespace(dtype="auto", backend="auto", no_cuda_graphs=True)
    cpu = torch.device("cpu")
    engines = {
        "plain": make_engine(tiny_target, None, args, cpu, max_num_seqs=2, seq_tokens=12),
        "spec": make_engine(tiny_target, tiny_drafter, args, cpu, max_num_seqs=2, seq_tokens=12, headroom=6),
    }
    arms = parse_arms(["plain", "spec"])
    rows, trimmed = sweep.run_sweep(
        engines, arms, [[1, 2, 3]], [1, 2], rounds=5, new_tokens=3, time_budget_s=0.0, progress=False
    )
    assert trimmed == {1: 1, 2: 1}
    assert sorted({(r["concurrency"], r["round"]) for r in rows}) == [(1, 1), (2, 1)]


def test_closed_loop_keeps_c_in_flight_and_counts_acceptance(tiny_target, tiny_drafter):
    args = argparse.Namespace(dtype="auto", backend="auto", no_cuda_graphs=True)
    engine = make_engine(
        tiny_target, tiny_drafter, args, torch.device("cpu"), max_num_seqs=3, seq_tokens=14, headroom=6
    )
    res = closed_loop(engine, [[5, 6, 7], [8, 9]], concurrency=3, num_requests=7, max_tokens=6)
    assert (res.requests, res.output_tokens, res.max_in_flight) == (7, 42, 3)
    assert res.stats.committed_tokens == 7 * 5  # every token after the prefill's comes from a verify round
    assert sum(acceptance_histogram(res.stats)) == res.stats.drafts
    decode_side = [s.batch for s in res.steps if s.plan != "Prefill"]
    assert 1 <= mean_batch(res.steps) == sum(decode_side) / len(decode_side) <= 3
    assert mean_batch([s for s in res.steps if s.plan == "Prefill"]) is None
    with pytest.raises(ValueError, match="concurrency"):
        closed_loop(engine, [[1]], concurrency=0, num_requests=1, max_tokens=2)


def test_acceptance_histogram_from_by_position_counts():
    # 10 speculating rounds: 4 accepted 0, 3 accepted 1, 2 accepted 2, 1 accepted all 3
    stats = SpecStats(drafts=10, accepted_by_position=[6, 3, 1])
    assert acceptance_histogram(stats) == [4, 3, 2, 1]
    assert acceptance_histogram(SpecStats(accepted_by_position=[0, 0])) == [0, 0, 0]


def test_rounds_take_successive_prompt_windows_shared_by_their_arms(monkeypatch):
    calls = []

    def fake_loop(engine, prompts, c, n, new_tokens, first=0):
        calls.append((c, first))
        return LoadResult(wall_s=1.0, requests=n, output_tokens=n * new_tokens, max_in_flight=c)

    class Levers:
        rounds = argparse.Namespace(policy=None, overlap=argparse.Namespace(used=0))

        def set_levers(self, **_):
            pass

    monkeypatch.setattr(sweep, "closed_loop", fake_loop)
    arms = parse_arms(["plain", "spec"], noise_arm=True)
    sweep.run_sweep({"plain": Levers(), "spec": Levers()}, arms, [[1]], [1, 3], rounds=2, new_tokens=4, progress=False)
    firsts = [f for _, f in calls]
    assert (
        firsts == [0] * 3 + [2] * 3 + [4] * 3 + [0] * 3 + [6] * 3 + [12] * 3
    )  # (warm-up + 2 rounds) x 3 arms, c=1 then c=3


def test_closed_loop_starts_at_the_given_prompt(tiny_target):
    args = argparse.Namespace(dtype="auto", backend="auto", no_cuda_graphs=True)
    engine = make_engine(tiny_target, None, args, torch.device("cpu"), max_num_seqs=2, seq_tokens=8)
    seen, real = [], engine.add_request

    def add_request(ids, params):
        seen.append(ids)
        return real(ids, params)

    engine.add_request = add_request
    prompts = [[1, 2], [3, 4], [5, 6]]
    closed_loop(engine, prompts, concurrency=2, num_requests=4, max_tokens=2, first=2)
    assert seen == [[5, 6], [1, 2], [3, 4], [5, 6]]


def test_output_lengths_are_seeded_spread_and_refuse_a_bad_spread():
    lengths = output_lengths(200, 64, 0.5)
    assert lengths == output_lengths(200, 64, 0.5) != output_lengths(200, 64, 0.5, seed=1)
    assert 32 <= min(lengths) < 40 and 88 < max(lengths) <= 96 and output_lengths(3, 64, 0.0) == [64] * 3
    for spread in (-0.1, 1.0):
        with pytest.raises(ValueError, match="spread"):
            output_lengths(3, 64, spread)


def test_varied_lengths_are_the_same_for_every_arm(tiny_target, tiny_drafter, prompts_file, tmp_path):
    argv = ["--target", str(tiny_target), "--drafter", str(tiny_drafter), "--prompts", str(prompts_file)]
    argv += ["--out", str(tmp_path), "--concurrency", "2", "--rounds", "1", "--new-tokens", "6"]
    argv += ["--arms", "plain", "spec", "--length-spread", "0.5", "--device", "cpu", "--no-progress"]
    assert sweep.main(argv) == 0
    rows = read_csv(tmp_path / "sweep.csv")
    lengths = output_lengths(3, 6, 0.5)  # three prompts; round 1 takes requests 4..7 of the cycle
    assert {int(r["output_tokens"]) for r in rows} == {sum(lengths[i % 3] for i in range(4, 8))}
    assert json.loads((tmp_path / "sweep.json").read_text())["length_spread"] == 0.5
    with pytest.raises(SystemExit, match="--length-spread"):
        sweep.main([*argv[:-5], "--length-spread", "1.5", "--device", "cpu"])
