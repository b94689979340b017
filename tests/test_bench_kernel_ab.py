"""The kernel before/after bench: its switches back to the previous dispatch (o's and down's split-K
reduce kernels, the in-step prologue), its cases and its argument checks (the timing itself needs a
GPU)."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch

from engine.bench import kernel_ab, kernel_ab_cases, kernel_ab_configs, kernel_fused
from engine.kernels import attention, fused_linear, gemm, gemm_tma, linear, mlp, norm, split_sum, tuning
from engine.kernels.tuning import SkinnyConfig
from tests.kernel_helpers import CUDA, randn

O_SHAPE, DOWN = (2560, 4096), (2560, 9728)
SPLIT = SkinnyConfig(1, 16, 64, 2, 4, 1)


ROWS_SPLIT = SkinnyConfig(16, 16, 64, 2, 4, 1)


def test_reduce_kernel_runs_the_reduce_kernels_and_restores_the_dispatch():
    assert gemm.DEFER_MAX_ROWS == 1 and sorted(gemm.EARLY_WEIGHTS) == ["deferred", "norm"]
    x1, x4, w = randn(1, 256), randn(4, 256), randn(16, 256)
    with kernel_ab.reduce_kernel():
        assert gemm.DEFER_MAX_ROWS == 0
        assert isinstance(linear.linear_with_config(x1, w, SPLIT, defer=True), torch.Tensor)
    assert gemm.DEFER_MAX_ROWS == 1
    assert isinstance(linear.linear_with_config(x1, w, SPLIT, defer=True), split_sum.SplitSum)
    assert isinstance(linear.linear_with_config(x4, w, ROWS_SPLIT, defer=True), torch.Tensor)


def test_the_h200_table_keeps_the_split_k_one_row_o_and_down():
    """What the deferral acts on: one-row o and fused SwiGLU->down are split-K GEMVs in the shipped
    table (the configs themselves change with each sweep)."""
    t = tuning.load("NVIDIA H200")
    for cfg in (t.linear[O_SHAPE][1], t.silu_mul_linear[DOWN][1]):
        assert cfg.block_m == 1 and cfg.split_k > 1


def test_a_candidate_runs_on_the_early_weights_gemv_whatever_the_dispatch():
    seen = []
    kernel_ab_cases.on_gemv(lambda: seen.append(gemm.EARLY_WEIGHTS))
    assert seen == [gemm.PROLOGUES] and sorted(gemm.EARLY_WEIGHTS) == ["deferred", "norm"]


@pytest.mark.parametrize("swiglu", [False, True])
def test_before_is_the_same_function(swiglu, monkeypatch):
    """Both sides of a pair (a split-K product into add + RMSNorm -> projection) give the same bits:
    at one row (the NORM-prologue GEMV) and, with deferral let up to four rows, at four
    (norm.add_rms_norm, then the projection), where only "after" defers."""
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 4)
    w, w2, nw = randn(32, 256), randn(48, 32), randn(32).abs().add(0.5)
    run = fused_linear.silu_mul_linear_with_config if swiglu else linear.linear_with_config
    gemv = SkinnyConfig(1, 16, 64, 1, 4, 1)

    def pair(x, r, cfg):
        h = run(x, w, cfg, defer=True)
        if x.shape[0] == 1:
            return fused_linear.add_rms_norm_linear_with_config(h, r, nw, 1e-6, w2, gemv)
        normed, summed = norm.add_rms_norm(h, r, nw, 1e-6)
        return linear.linear(normed, w2), summed

    for m, cfg in ((1, SPLIT), (4, ROWS_SPLIT)):
        x, r = randn(m, 512 if swiglu else 256), randn(m, 32)
        after = pair(x, r, cfg)
        with kernel_ab.reduce_kernel():
            prev = pair(x, r, cfg)
        assert all(torch.equal(a, b) for a, b in zip(after, prev, strict=True))


def test_only_keeps_the_rows_of_one_op():
    rows = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 8], "prefetch: SwiGLU")]
    assert len(rows) == len(kernel_ab_configs.PREFETCH_SWIGLU) and {m for _, m in rows} == {8}


def test_each_row_switches_back_its_own_change():
    assert kernel_ab.switch_for("prefetch: norm→q|k|v [16, 32, 256, 1, 4, 4]") is kernel_ab.in_step_prologue
    assert kernel_ab.switch_for("o → norm→gate|up") is kernel_ab.reduce_kernel
    assert kernel_ab.switch_for("rope → attention, ctx 256") is kernel_ab.wait_first_attention
    assert kernel_ab.switch_for("gate|up → SwiGLU [16, 32, 64, 1, 4, 4]") is kernel_ab.unfused_mlp


def test_unfused_mlp_turns_the_epilogue_off_and_restores_it():
    on = mlp.GLU_MAX_ROWS
    assert on > 0
    with kernel_ab.unfused_mlp():
        assert mlp.GLU_MAX_ROWS == 0
    assert on == mlp.GLU_MAX_ROWS


def test_glu_rows_at_2_to_64_rows_with_candidates_of_their_m_tile():
    labels = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 8, 64], "gate|up → SwiGLU")]
    assert {m for _, m in labels} == {8, 64} and ("gate|up → SwiGLU", 8) in labels
    for c in kernel_ab_configs.GLU_CANDIDATES:
        assert tuning.check_config(c) is None and c.split_k == 1 and c.block_m in (16, 64), c
        assert (f"gate|up → SwiGLU {list(c)}", 8 if c.block_m == 16 else 64) in labels


def test_the_glu_case_is_the_pair_before_and_the_epilogue_after(monkeypatch):
    """On a small gate|up in fp32 (this host's device): before = gate|up and silu_and_mul, after =
    the epilogue at the dispatched half tile, both at the reference; with a tiling, after runs it."""
    monkeypatch.setattr(kernel_ab_cases.cases, "DEVICE", "cuda" if CUDA else "cpu")
    monkeypatch.setattr(kernel_ab_cases.cases, "DTYPE", torch.float32)
    dot = SkinnyConfig(16, 32, 32, 1, 4, 2)
    tables = tuning.TunedTables("test", linear={(128, 64): {8: dot}, (64, 64): {8: dot}}, fused_m_max=1)
    monkeypatch.setattr(tuning, "tables_for", lambda device: tables)
    real, seen = mlp.swiglu_linear_with_config, []
    monkeypatch.setattr(mlp, "swiglu_linear_with_config", lambda x, w, cfg: seen.append(cfg) or real(x, w, cfg))
    torch.manual_seed(4)
    nbytes, _, fn, ref, after = kernel_ab_cases.glu_case(128, 64, 5)
    assert nbytes == 128 * 64 * 4 and after is fn
    assert torch.allclose(fn(0), ref, atol=1e-5, rtol=1e-4) and seen == [dot._replace(block_n=16)]
    with kernel_ab.unfused_mlp():
        assert torch.allclose(fn(0), ref, atol=1e-5, rtol=1e-4) and len(seen) == 1
    other = SkinnyConfig(16, 16, 64, 1, 4, 3)
    *_, ref, with_cfg = kernel_ab_cases.glu_case(128, 64, 5, other)
    assert torch.allclose(with_cfg(0), ref, atol=1e-5, rtol=1e-4) and seen[-1] == other


def test_wait_first_attention_turns_the_early_prefetch_off_and_restores_it():
    assert attention.EARLY_KV
    with kernel_ab.wait_first_attention():
        assert not attention.EARLY_KV
    assert attention.EARLY_KV


def test_cases_cover_o_and_down_at_every_m_and_the_norm_pairs_at_one_row_and_2_to_16():
    rows = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 8, 16, 64])]
    for m in (1, 8, 16, 64):
        assert ("o", m) in rows and ("SwiGLU→down", m) in rows
    assert ("norm→q|k|v", 1) in rows and ("norm→gate|up", 1) in rows
    for m in (1, 8, 16, 64):
        assert ("o → norm→gate|up", m) in rows and ("SwiGLU→down → norm→q|k|v", m) in rows
        assert ("rope → attention, ctx 256", m) in rows and ("rope → attention, ctx 2048", m) in rows
    assert {m for label, m in rows if label.startswith("norm")} == {1, 8, 16}  # the unfused pairs at 2-16
    assert sum(label.startswith("o [") for label, _ in rows) == len(kernel_ab_configs.CANDIDATES)
    assert sum(label.startswith("norm→gate|up [") for label, _ in rows) == len(kernel_ab_configs.NORM_CANDIDATES)
    for c in kernel_ab_configs.CANDIDATES + kernel_ab_configs.NORM_CANDIDATES:
        assert tuning.check_config(c) is None and c.block_m == 1, c
    assert all(c.split_k == 1 for c in kernel_ab_configs.NORM_CANDIDATES)  # the prologue needs whole rows
    for c in kernel_ab_configs.PREFETCH_NORM + kernel_ab_configs.PREFETCH_SWIGLU:
        assert tuning.check_config(c) is None and c.block_m == 16, c
    assert all(c.split_k == 1 for c in kernel_ab_configs.PREFETCH_NORM)


@pytest.mark.parametrize("argv", [["--ms", "0"], ["--ms", "1", "-3"]])
def test_refuses_bad_row_counts(tmp_path, argv):
    with pytest.raises(SystemExit, match="--ms"):
        kernel_ab.main(["--out", str(tmp_path), *argv])


def test_refuses_a_prefix_no_row_has_before_it_runs(tmp_path):
    with pytest.raises(SystemExit, match="--only: no row's op starts with 'nosuch'"):
        kernel_ab.main(["--out", str(tmp_path), "--only", "nosuch"])


@pytest.mark.parametrize("flag", ["--fused-table", "--pair-table"])
def test_refuses_a_folder_for_a_table_before_it_runs(tmp_path, flag):
    with pytest.raises(SystemExit, match=f"{flag}: .* is a folder"):
        kernel_ab.main(["--out", str(tmp_path), flag, str(tmp_path)])


@pytest.mark.skipif(CUDA, reason="checks the message on a host without a GPU")
def test_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="CUDA"):
        kernel_ab.main(["--out", str(tmp_path)])


def test_a_sweeps_table_is_put_in_force_and_the_shipped_one_restored(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(tuning, "_by_device", {("cuda", 0): tuning.DEFAULT})
    retuned = tuning.TunedTables("nvidia-h200", linear={O_SHAPE: {8: SkinnyConfig(16, 64, 64, 4, 4, 5)}})
    path = tmp_path / "nvidia-h200.json"
    path.write_text(tuning.dumps(retuned, "NVIDIA H200"))
    with tuning.in_force(kernel_ab.read_tables(path)):
        for i in (0, 1):
            assert tuning._by_device["cuda", i].linear[O_SHAPE][8] == SkinnyConfig(16, 64, 64, 4, 4, 5)
    assert tuning._by_device == {("cuda", 0): tuning.DEFAULT}


@pytest.mark.parametrize(("text", "match"), [(None, "No such file"), ("{", "Expecting"), ('{"format": 9}', "format-1")])
def test_a_missing_or_malformed_table_is_refused(tmp_path, text, match):
    path = tmp_path / "t.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=match):
        kernel_ab.read_tables(path)


def test_prefetch_rows_switch_the_prologue_reads_back_and_restore_them():
    assert gemm.PROLOGUE_PREFETCH
    with kernel_ab.in_step_prologue():
        assert not gemm.PROLOGUE_PREFETCH
    assert gemm.PROLOGUE_PREFETCH
    labels = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 8, 64])]
    prefetch = {m for label, m in labels if label.startswith("prefetch:")}
    assert prefetch == {8}  # the fused tl.dot path's rows: 2-16 rows only
    assert ("norm→gate|up", 8) in labels and ("SwiGLU→down", 8) in labels  # the unfused pairs beside them


def test_fused_winners_beat_their_dispatched_pair_by_the_margin_and_join_the_table():
    row = lambda op, m, us: {"op": op, "M": m, "after_us": us}  # noqa: E731
    rows = [
        row("norm→gate|up", 8, 28.5),
        row("prefetch: norm→gate|up [16, 64, 128, 1, 4, 3]", 8, 27.0),  # 0.947: a winner
        row("prefetch: norm→gate|up [16, 128, 64, 1, 4, 4]", 8, 26.0),  # the better one
        row("norm→q|k|v", 8, 11.7),
        row("prefetch: norm→q|k|v [16, 32, 256, 1, 4, 4]", 8, 11.5),  # inside the 3 % margin: not taken
        row("prefetch: SwiGLU→down [16, 32, 128, 8, 4, 3]", 16, 10.0),  # no pair measured at 16: not taken
    ]
    winners = kernel_fused.fused_winners(rows)
    assert list(winners) == [("norm→gate|up", 8)]
    cfg, ratio = winners["norm→gate|up", 8]
    assert cfg == SkinnyConfig(16, 128, 64, 1, 4, 4) and ratio == pytest.approx(26.0 / 28.5)
    shipped = tuning.load("NVIDIA H200")
    table = kernel_fused.with_fused(shipped, winners)
    assert table.add_rms_norm_linear[(19456, 2560)][8] == cfg
    assert table.add_rms_norm_linear[(19456, 2560)][1] == shipped.add_rms_norm_linear[(19456, 2560)][1]
    assert table.linear == shipped.linear and table.silu_mul_linear == shipped.silu_mul_linear
    again = tuning.parse(json.loads(tuning.dumps(table, "NVIDIA H200")))  # what decode_ab reads back
    assert again.add_rms_norm_linear == table.add_rms_norm_linear


def test_the_rope_attention_case_matches_its_reference_on_every_copy(monkeypatch):
    """The case kernel_ab times: the store then the attention, against the fp32 references (here in
    fp32 on this host's device, small caches so the rotation still makes several copies)."""
    monkeypatch.setattr(kernel_ab_cases.cases, "DEVICE", "cuda" if CUDA else "cpu")
    monkeypatch.setattr(kernel_ab_cases.cases, "DTYPE", torch.float32)
    monkeypatch.setattr(kernel_ab_cases.cases, "ROTATE_BYTES", 1 << 20)
    torch.manual_seed(3)
    nbytes, copies, fn, ref, after = kernel_ab_cases.rope_attention_case(2, 40)
    assert nbytes == 2 * 2 * 41 * 8 * 128 * 4 and copies == 2 and after is fn
    for i in range(copies):
        assert torch.allclose(fn(i), ref, atol=1e-4, rtol=1e-4)


def test_tma_rows_at_1_and_8_to_64_rows_with_their_m_tile_and_no_split_glu():
    labels = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 4, 8, 32, 64], "tma:")]
    assert {m for _, m in labels} == {1, 8, 32, 64}
    for name in ("q|k|v", "o", "down", "gate|up → SwiGLU", "lm_head"):
        assert (f"tma: {name}", 32) in labels
    for m in (8, 32, 64):
        for cfg in kernel_ab_configs.tma_configs(m, glu=False):
            assert tuning.check_config(cfg) is None and cfg.block_m == max(16, m) and cfg.block_n % 64 == 0, cfg
            assert cfg.tma == 1 and (f"tma: o {list(cfg)}", m) in labels
        assert all(c.split_k == 1 for c in kernel_ab_configs.tma_configs(m, glu=True))
    assert kernel_ab.switch_for("tma: down [64, 64, 64, 4, 4, 5, 1]") is kernel_ab.tma_off
    with kernel_ab.tma_off():
        assert not gemm.TMA
    assert gemm.TMA


def test_the_tma_case_runs_the_dispatch_without_tma_before_and_the_config_after(monkeypatch):
    monkeypatch.setattr(kernel_ab_cases.cases, "DEVICE", "cuda" if CUDA else "cpu")
    monkeypatch.setattr(kernel_ab_cases.cases, "DTYPE", torch.float32)
    dot = SkinnyConfig(16, 64, 32, 1, 4, 2, tma=1)
    monkeypatch.setattr(tuning, "tables_for", lambda device: tuning.TunedTables("test", linear={(64, 64): {32: dot}}))
    launched = []
    real = gemm_tma.launch
    monkeypatch.setattr(gemm_tma, "launch", lambda *a, **kw: launched.append(a[2]) or real(*a, **kw))
    torch.manual_seed(6)
    _, _, before, ref, after = kernel_ab_cases.tma_case(64, 64, 20, False)
    with kernel_ab.tma_off():
        assert torch.allclose(before(0), ref, atol=1e-5, rtol=1e-4) and launched == []
    assert torch.allclose(after(0), ref, atol=1e-5, rtol=1e-4) and launched == [dot]
    other = SkinnyConfig(32, 64, 64, 1, 4, 2, tma=1)
    *_, ref, after = kernel_ab_cases.tma_case(128, 64, 20, True, other)
    assert torch.allclose(after(0), ref, atol=1e-5, rtol=1e-4) and launched[-1] == other


def test_pair_rows_time_each_candidate_with_the_projection_after_it():
    labels = [label for label, m, _ in kernel_ab.cases_for([1, 8], "pair:")]
    assert len(labels) == 2 * len(kernel_ab_configs.PAIR_CANDIDATES)
    for c in kernel_ab_configs.PAIR_CANDIDATES:
        assert tuning.check_config(c) is None and c.block_m == 1 and c.split_k > 1, c  # partials to defer
        assert f"pair: o {list(c)} → norm→gate|up" in labels and f"pair: SwiGLU→down {list(c)} → norm→q|k|v" in labels
    assert kernel_ab.switch_for("pair: o [1, 8, 512, 2, 4, 2, 0] → norm→gate|up") is nullcontext  # before: dispatched


@pytest.mark.parametrize("swiglu", [False, True])
def test_the_pair_case_runs_the_first_projection_at_the_config_after(swiglu, monkeypatch):
    """On small shapes in fp32 (this host's device): before = the pair as dispatched, after = the first
    projection at the row's config, its partials summed by the next norm prologue; both at the reference."""
    monkeypatch.setattr(kernel_ab_cases.cases, "DEVICE", "cuda" if CUDA else "cpu")
    monkeypatch.setattr(kernel_ab_cases.cases, "DTYPE", torch.float32)
    gemv = SkinnyConfig(1, 16, 64, 2, 4, 2)
    tables = tuning.TunedTables(
        "test", linear={(64, 128): {1: gemv}, (96, 64): {1: SkinnyConfig(1, 16, 64, 1, 4, 1)}}, fused_m_max=1
    )
    monkeypatch.setattr(tuning, "tables_for", lambda device: tables)
    launched = []
    real = gemm.launch
    monkeypatch.setattr(gemm, "launch", lambda *a, **kw: launched.append(a[2]) or real(*a, **kw))
    for module in (linear, fused_linear):
        monkeypatch.setattr(module, "launch", gemm.launch)
    torch.manual_seed(7)
    other = SkinnyConfig(1, 32, 64, 4, 4, 2)
    _, _, before, ref, after = kernel_ab_cases.pair_case((64, 128), 96, swiglu, 1, other)
    assert torch.allclose(before(0), ref, atol=1e-4, rtol=1e-4) and launched[0] == gemv
    assert torch.allclose(after(0), ref, atol=1e-4, rtol=1e-4) and launched[-2] == other


def test_pair_winners_beat_their_own_before_and_replace_the_one_row_entries():
    row = lambda op, before, after: {"op": op, "M": 1, "before_us": before, "after_us": after}  # noqa: E731
    rows = [
        row("pair: o [1, 16, 512, 2, 4, 2, 0] → norm→gate|up", 33.0, 32.0),  # 0.970: a winner
        row("pair: o [1, 8, 256, 4, 4, 2, 0] → norm→gate|up", 33.0, 31.0),  # the better one
        row("pair: SwiGLU→down [1, 16, 256, 2, 4, 2, 0] → norm→q|k|v", 23.0, 22.9),  # inside the 1 % margin
        row("o → norm→gate|up", 33.0, 30.0),  # not a pair: row
    ]
    winners = kernel_fused.pair_winners(rows)
    assert list(winners) == [("o → norm→gate|up", 1)]
    cfg, ratio = winners["o → norm→gate|up", 1]
    assert cfg == SkinnyConfig(1, 8, 256, 4, 4, 2) and ratio == pytest.approx(31.0 / 33.0)
    shipped = tuning.load("NVIDIA H200")
    table = kernel_fused.with_fused(shipped, winners, kernel_fused.PAIR_OPS)
    assert table.linear[O_SHAPE][1] == cfg and table.linear[O_SHAPE][8] == shipped.linear[O_SHAPE][8]
    assert table.silu_mul_linear == shipped.silu_mul_linear
    assert table.add_rms_norm_linear == shipped.add_rms_norm_linear
    again = tuning.parse(json.loads(tuning.dumps(table, "NVIDIA H200")))  # what decode_ab reads back
    assert again.linear == table.linear
