"""Triton kernels against their torch references.

On CPU the kernels run under the Triton interpreter (fp32/fp16, small shapes); on a CUDA host the
same tests run compiled, plus the GPU-only checks (bf16, Qwen3-4B shapes, batch-invariance
bit-exactness, CUDA-graph replay). Every output and cache is poisoned (NaN / sentinel) before a
run, so an element a kernel fails to write cannot match its reference by accident.

Tolerance policy: relative error = ||out - ref|| / ||ref|| (fp32 math on both sides), bounded per
dtype by TOL; kernels that only select or compare (argmax, accept_prefix, cache copies of v, the
residual sum) must match exactly.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # must precede the first kernel launch (kernels bind triton lazily, see _triton.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed: the triton backend cannot be tested")

import numpy as np  # noqa: E402

from engine.kernels import (  # noqa: E402
    activation,
    attention,
    fused_linear,
    get_ops,
    linear,
    norm,
    rope,
    sampling,
    tuning,
)
from engine.kernels.tuning import SkinnyConfig, TunedTables  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Attention rounds the probabilities to the KV dtype before the PV product.
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (bf16, 4B shapes, graphs)")
POISON_INT = -7777


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "kernel output has NaN/inf (an unwritten or misread element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """torch.empty / empty_like return NaN (float) or POISON_INT (int) filled tensors."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool and t.numel():
            t.fill_(POISON_INT)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


@pytest.fixture
def row_invariant_dot(monkeypatch):
    """The interpreter's tl.dot is numpy matmul, whose OpenBLAS kernels round a row differently
    depending on its position in the tile. Tensor cores do not, so for the batch-invariance tests
    the interpreter gets a row-independent dot (same products, fixed per-row summation)."""
    if not INTERPRET:
        return
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = np.einsum("mk,kn->mn", a.data.astype(np.float32), b.data.astype(np.float32))
        return interpreter.TensorHandle(out.astype(d.data.dtype) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


# --- norm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (1, 64), (5, 300), (2, 3, 96), (3, 2560)])
def test_rms_norm(dtype, shape):
    torch.manual_seed(0)
    x, w = randn(*shape, dtype=dtype, scale=3.0), randn(shape[-1], dtype=dtype)
    out, ref = norm.rms_norm(x, w, 1e-6), norm.rms_norm_ref(x, w, 1e-6)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (4, 256), (2, 3, 100)])
def test_add_rms_norm(dtype, shape):
    torch.manual_seed(1)
    x, r, w = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype), randn(shape[-1], dtype=dtype)
    out, summed = norm.add_rms_norm(x, r, w, 1e-5)
    ref, ref_sum = norm.add_rms_norm_ref(x, r, w, 1e-5)
    assert torch.equal(summed, ref_sum)
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


def test_rms_norm_strided_rows():
    torch.manual_seed(2)
    wide = randn(6, 200)
    x, w = wide[:, 40:168], randn(128)  # rows of a wider buffer: stride 200
    assert rel_err(norm.rms_norm(x, w, 1e-6), norm.rms_norm_ref(x, w, 1e-6)) < TOL[torch.float32]


# --- qk norm + rope + store -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 32), (2, 2, 16), (4, 1, 64), (8, 2, 32)])
@pytest.mark.parametrize("with_q", [True, False])
def test_qk_norm_rope_store(dtype, hq, hkv, d, with_q):
    torch.manual_seed(3)
    t, page, blocks = 9, 16, 4
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, scale=2.0)  # fused projection: strided views
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    positions = torch.randint(0, 100, (t,), device=DEV)
    slots = torch.tensor([0, -1, 15, 16, 17, 31, -1, 47, 63], device=DEV)  # page boundaries, skips
    cos_sin = rope.rope_cos_sin(128, d, 1e6, DEV)
    qw, kw = randn(d, dtype=dtype), randn(d, dtype=dtype)
    caches = [torch.full((blocks, page, hkv, d), float("nan"), dtype=dtype, device=DEV) for _ in range(4)]
    kc, vc, kc_ref, vc_ref = caches
    args = (positions, slots, qw if with_q else None, kw, cos_sin)
    q_out = rope.qk_norm_rope_store(q if with_q else None, k, v, *args, kc, vc, 1e-6)
    q_ref = rope.qk_norm_rope_store_ref(q if with_q else None, k, v, *args, kc_ref, vc_ref, 1e-6)
    if with_q:
        assert q_out.is_contiguous() and q_out.dtype == q_ref.dtype
        assert rel_err(q_out, q_ref) < TOL[dtype]
    else:
        assert q_out is None
    assert torch.equal(kc.isnan(), kc_ref.isnan()), "written slots differ (slot -1 must be skipped)"
    written = ~kc_ref.isnan()
    assert rel_err(kc[written], kc_ref[written]) < TOL[dtype]
    assert torch.equal(vc.nan_to_num(POISON_INT), vc_ref.nan_to_num(POISON_INT))


def test_qk_norm_rope_store_empty():
    kc = torch.zeros(2, 16, 2, 32, device=DEV)
    k = randn(0, 2, 32)
    cs = rope.rope_cos_sin(16, 32, 1e4, DEV)
    empty = torch.zeros(0, dtype=torch.int64, device=DEV)
    out = rope.qk_norm_rope_store(randn(0, 4, 32), k, k, empty, empty, randn(32), randn(32), cs, kc, kc, 1e-6)
    assert out.shape == (0, 4, 32)


# --- paged attention --------------------------------------------------------------------------


def make_paged(spans, ctxs, hq, hkv, d, dtype, page=16, spare_blocks=3):
    """Caches full of NaN except the rows each sequence owns; unused block-table entries point at
    a NaN block. Blocks are shuffled so a sequence's pages are not contiguous."""
    seq_lens = [c + s for c, s in zip(ctxs, spans, strict=True)]
    need = [-(-n // page) for n in seq_lens]
    num_blocks = sum(need) + spare_blocks
    perm, poison_block = torch.randperm(num_blocks - 1), num_blocks - 1
    bt = torch.full((len(spans), max(need + [1]) + 1), poison_block, dtype=torch.int32)
    owned = torch.zeros(num_blocks * page, dtype=torch.bool)
    start = 0
    for b, n in enumerate(seq_lens):
        blocks = perm[start : start + need[b]]
        start += need[b]
        bt[b, : need[b]] = blocks.int()
        pos = torch.arange(n)
        owned[blocks[pos // page] * page + pos % page] = True
    kc, vc = (torch.randn(num_blocks * page, hkv, d) for _ in range(2))
    kc[~owned], vc[~owned] = float("nan"), float("nan")
    kc, vc = (c.view(num_blocks, page, hkv, d).to(dtype) for c in (kc, vc))
    qsl = torch.zeros(len(spans) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(spans).cumsum(0)
    q = (torch.randn(int(qsl[-1]), hq, d) * 2).to(dtype)
    to = lambda t: t.to(DEV)
    return to(q), to(kc), to(vc), to(bt), to(torch.tensor(seq_lens, dtype=torch.int32)), to(qsl), max(spans)


ATTN_CASES = [
    # spans, cached context before each span, hq, hkv, d, causal, forced splits
    ([1, 3, 8, 0], [5, 17, 40, 3], 4, 2, 32, True, None),  # ragged + a 0-length row
    ([1, 1, 1], [60, 15, 0], 4, 1, 16, True, None),  # decode, GQA 4, page boundary, first token
    ([1, 1], [100, 33], 2, 2, 64, True, 4),  # decode, MHA, flash-decoding split
    ([1, 2], [70, 16], 8, 2, 32, True, 8),  # split with a span: causal inside partitions
    ([5, 0, 7], [30, 9, 0], 4, 2, 32, False, None),  # drafter block: non-causal
    ([8, 8], [16, 47], 4, 4, 16, False, 2),  # non-causal + split
    ([24], [9], 2, 1, 32, True, None),  # prefill: several q tiles
    ([1], [200], 4, 2, 128, True, None),  # head_dim 128, auto split
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spans,ctxs,hq,hkv,d,causal,splits", ATTN_CASES)
def test_paged_attention(dtype, spans, ctxs, hq, hkv, d, causal, splits):
    torch.manual_seed(4)
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, hq, hkv, d, dtype)
    out = attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, d**-0.5, causal, num_splits=splits)
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, d**-0.5, causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, ref) < ATTN_TOL[dtype]


def test_paged_attention_padding_rows_untouched():
    """Rows past query_start_loc[B] (a padded launch) are neither read as queries nor written."""
    torch.manual_seed(5)
    q, kc, vc, bt, seq, qsl, mq = make_paged([1, 1], [40, 7], 4, 2, 32, torch.float32)
    q_pad = torch.cat([q, torch.full_like(q[:2], float("nan"))])
    out = attention.paged_attention(q_pad, kc, vc, bt, seq, qsl, mq, 32**-0.5, True, num_splits=4)
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, 32**-0.5, True)
    assert rel_err(out[:2], ref) < ATTN_TOL[torch.float32]
    assert out[2:].isnan().all()


def _invariance_check(dtype, hq, hkv, d, causal):
    spans, ctxs = [8, 1, 1, 3, 1, 1, 1], [40, 10, 70, 5, 16, 31, 2]
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, hq, hkv, d, dtype)
    run = lambda q_, bt_, seq_, span: attention.paged_attention(
        q_,
        kc,
        vc,
        bt_,
        seq_,
        torch.tensor([0, span], dtype=torch.int32, device=DEV),
        span,
        d**-0.5,
        causal,
        batch_invariant=True,
    )
    full = attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, d**-0.5, causal, batch_invariant=True)
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, d**-0.5, causal, batch_invariant=True)
    assert rel_err(full, ref) < ATTN_TOL[dtype]
    # Each row of the span computed alone (a decode at its position) or as a shorter span.
    for i in range(spans[0]):
        alone_len = torch.tensor([ctxs[0] + i + 1 if causal else ctxs[0] + spans[0]], dtype=torch.int32, device=DEV)
        assert torch.equal(run(q[i : i + 1], bt[:1], alone_len, 1)[0], full[i]), f"span row {i}"
    assert torch.equal(run(q[:3], bt[:1], seq[:1] - 5 if causal else seq[:1], 3), full[:3])
    # Every other sequence alone vs in the batch of 7.
    for b in range(1, len(spans)):
        lo, hi = int(qsl[b]), int(qsl[b + 1])
        assert torch.equal(run(q[lo:hi], bt[b : b + 1], seq[b : b + 1], hi - lo), full[lo:hi]), f"seq {b}"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 32), (4, 4, 16)])
def test_paged_attention_batch_invariant(row_invariant_dot, causal, hq, hkv, d):
    torch.manual_seed(6)
    _invariance_check(torch.float32, hq, hkv, d, causal)


# --- linear -----------------------------------------------------------------------------------

LINEAR_CASES = [
    (1, 96, 256, linear.SkinnyConfig(1, 32, 64, 1, 4, 2)),  # GEMV
    (1, 40, 1000, linear.SkinnyConfig(1, 32, 128, 4, 4, 2)),  # GEMV, ragged K, split-K
    (3, 64, 200, linear.SkinnyConfig(16, 32, 64, 2, 4, 2)),  # dot path, split-K, ragged K
    (17, 130, 96, linear.SkinnyConfig(32, 64, 32, 1, 4, 2)),  # ragged N, one M tile
    (40, 64, 128, linear.SkinnyConfig(16, 32, 32, 4, 4, 2)),  # several M tiles + split-K
    (5, 48, 160, None),  # the default heuristic
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", LINEAR_CASES)
def test_linear_skinny(dtype, m, n, k, cfg):
    torch.manual_seed(7)
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, k)
    out = linear.linear_with_config(x, w, cfg)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, linear.linear_ref(x.float(), w.float())) < TOL[dtype]


def use_tables(monkeypatch, tables: TunedTables) -> None:
    """Make `tables` what the kernels find for the test device (as if loaded from its JSON file)."""
    device = torch.empty(0, device=DEV).device
    monkeypatch.setattr(tuning, "_by_device", {(device.type, device.index): tables})


def test_linear_dispatch(monkeypatch):
    torch.manual_seed(8)
    use_tables(monkeypatch, tuning.DEFAULT)
    w = randn(64, 96)
    for shape in [(0, 96), (1, 96), (2, 3, 96), (9, 96)]:
        x = randn(*shape)
        out = linear.linear(x, w)
        assert out.shape == (*shape[:-1], 64)
        if x.numel():
            assert rel_err(out, linear.linear_ref(x, w)) < TOL[torch.float32]
    use_tables(monkeypatch, TunedTables("test", m_max=4))  # above the crossover: F.linear
    x = randn(9, 96)
    assert torch.equal(linear.linear(x, w), linear.linear_ref(x, w))
    assert linear.skinny_config(5, 64, 96, TunedTables("test", m_max=4)) is None
    assert linear.skinny_config(16, 64, 96) == linear.default_skinny_config(16, 64, 96)  # DEFAULT: m_max 16
    assert linear.skinny_config(17, 64, 96) is None
    # A tuned shape uses its table entry per M bucket; a missing bucket means cuBLAS.
    gemv, dot = SkinnyConfig(1, 16, 32, 1, 2, 1), SkinnyConfig(16, 16, 32, 2, 4, 1)
    t = TunedTables("test", linear={(64, 96): {1: gemv, 2: dot}})
    assert linear.skinny_config(1, 64, 96, t) == SkinnyConfig(1, 16, 32, 1, 2, 1)
    assert linear.skinny_config(2, 64, 96, t).split_k == 2
    assert linear.skinny_config(3, 64, 96, t) is None
    assert linear.skinny_config(2, 64, 128, t) == linear.default_skinny_config(2, 64, 128)  # untuned shape
    use_tables(monkeypatch, t)
    x = randn(2, 96)
    assert rel_err(linear.linear(x, w), linear.linear_ref(x, w)) < TOL[torch.float32]
    x = randn(3, 96)  # bucket 4 is missing: F.linear, bit for bit
    assert torch.equal(linear.linear(x, w), linear.linear_ref(x, w))


# --- tuned tables (engine/kernels/tuned/<device>.json) --------------------------------------------


def test_device_slug():
    assert tuning.device_slug("NVIDIA H200") == "nvidia-h200"
    assert tuning.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert tuning.device_slug("  AMD Instinct MI300X (gfx942) ") == "amd-instinct-mi300x-gfx942"
    assert tuning.tuned_path("NVIDIA H200").name == "nvidia-h200.json"


def test_tuned_h200_file():
    """The shipped H200 table parses without dropping anything, covers the Qwen3-4B projections,
    and every entry is runnable (values change with each --write-tuned sweep; not pinned here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped entry would warn
        t = tuning.load("NVIDIA H200")
    assert t.source == str(tuning.TUNED_DIR / "nvidia-h200.json") and t.device == "nvidia-h200"
    assert t.m_max >= 1 and t.linear is not tuning.DEFAULT.linear
    assert {(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728), (151936, 2560)} <= set(t.linear)
    assert any(1 in per_m for per_m in t.linear.values())  # the decode row count is tuned somewhere
    for table in (t.linear, t.silu_mul_linear, t.add_rms_norm_linear):
        for per_m in table.values():
            for bucket, cfg in per_m.items():
                assert tuning.check_config(cfg) is None and (cfg.block_m != 1 or bucket == 1)
    # The writer's text round-trips.
    again = tuning.parse(json.loads(tuning.dumps(t, "NVIDIA H200")))
    assert (again.linear, again.silu_mul_linear, again.add_rms_norm_linear) == (
        t.linear,
        t.silu_mul_linear,
        t.add_rms_norm_linear,
    )
    assert (again.m_max, again.fused_m_max, again.norm_m_max) == (t.m_max, t.fused_m_max, t.norm_m_max)


def test_tuned_package_data():
    tomllib = pytest.importorskip("tomllib")  # python >= 3.11
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "tuned/*.json" in pyproject["tool"]["setuptools"]["package-data"]["engine.kernels"]


def test_tuned_fallback(tmp_path):
    assert tuning.load(None) is tuning.DEFAULT
    assert tuning.load("NVIDIA Future GPU", tmp_path) is tuning.DEFAULT  # no file: default heuristic
    path = tuning.tuned_path("Broken GPU", tmp_path)
    for text in (
        "{not json",
        json.dumps({"format": 99}),
        json.dumps([1, 2]),
        json.dumps({"format": 1, "linear": {"m_max": "16"}}),
        json.dumps({"format": 1, "linear": []}),
        json.dumps({"format": 1, "add_rms_norm_linear": {"m_max": -1}}),
    ):
        path.write_text(text)
        with pytest.warns(UserWarning, match="ignoring the tuned table"):
            assert tuning.load("Broken GPU", tmp_path) is tuning.DEFAULT
    # Bad entries are dropped (that bucket then falls back to cuBLAS), good ones kept.
    good = [16, 32, 128, 4, 4, 4]
    data = {
        "format": 1,
        "device": "Partly GPU",
        "linear": {
            "m_max": 8,
            "configs": {
                "64x96": {
                    "1": [1, 16, 256, 1, 4, 1],
                    "2": [1, 16, 256, 1, 4, 1],
                    "4": good,
                    "3": good,
                    "8": [16, 24, 64, 1, 4, 3],
                    "16": [16, 32, 64],
                    "32": [16, 32, 64, 1, 3, 3],
                    "64": "oops",
                },
                "64by96": {"1": good},
            },
        },
        "silu_mul_linear": {"configs": {"10x20": {"4": good, "8": [16, 32, 128, 0, 4, 4]}}},
    }
    tuning.tuned_path("Partly GPU", tmp_path).write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="dropped"):
        t = tuning.load("Partly GPU", tmp_path)
    assert t.device == "partly-gpu" and t.m_max == 8 and t.fused_m_max == tuning.DEFAULT_FUSED_M_MAX
    assert t.linear == {(64, 96): {1: SkinnyConfig(1, 16, 256, 1, 4, 1), 4: SkinnyConfig(*good)}}
    assert t.silu_mul_linear == {(10, 20): {4: SkinnyConfig(*good)}}
    assert t.add_rms_norm_linear == {} and t.norm_m_max == 0  # a section the file lacks is empty


def test_tables_for_device(monkeypatch):
    """Loaded once per device at its first use, by the slug of the CUDA device name (injected here)."""
    names = []

    def fake_name(device=None):
        names.append(device)
        return "NVIDIA H200"

    monkeypatch.setattr(tuning, "_by_device", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", fake_name)
    h200 = tuning.tables_for(torch.device("cuda", 0))
    assert h200.device == "nvidia-h200" and (2560, 9728) in h200.linear
    assert tuning.tables_for(torch.device("cuda", 0)) is h200 and len(names) == 1
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Unknown Accelerator 9000")
    assert tuning.tables_for(torch.device("cuda", 1)) is tuning.DEFAULT
    assert tuning.tables_for(torch.device("cpu")) is tuning.DEFAULT  # the interpreter: never tuned
    tuning.reset()
    assert tuning._by_device == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_batch_invariant(row_invariant_dot, dtype):
    torch.manual_seed(9)
    n, k = 80, 200  # ragged against the fixed 64-wide N and K tiles
    x, w = randn(64, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    full = linear.linear_batch_invariant(x, w)
    assert rel_err(full, linear.linear_batch_invariant_ref(x.float(), w.float())) < TOL[dtype]
    for rows in (1, 7, 33):
        assert torch.equal(linear.linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(linear.linear_batch_invariant(x[5:6], w), full[5:6])
    assert linear.linear_batch_invariant(x[:0], w).shape == (0, n)


# --- fused SwiGLU + down projection ----------------------------------------------------------------

FUSED_CASES = [
    # m, n, inter (the down weight is [n, inter], the input [m, 2 inter]), config
    (1, 48, 200, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # GEMV, I ragged against BLOCK_K
    (1, 40, 300, SkinnyConfig(1, 32, 128, 2, 4, 1)),  # GEMV, split-K, ragged I and N
    (3, 64, 200, SkinnyConfig(16, 32, 64, 2, 4, 2)),  # dot path, split-K, ragged I
    (16, 72, 160, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # dot path, a full M tile, ragged N and I
    (16, 64, 256, SkinnyConfig(16, 64, 128, 4, 4, 2)),  # split 4 over 2 K tiles: empty splits add zeros
    (3, 50, 96, None),  # the default heuristic
]


def fused_ref(x, w):
    """The reference's rounding of the activation (in the input dtype), then an fp32 product."""
    return linear.linear_ref(activation.silu_and_mul_ref(x).float(), w.float())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,inter,cfg", FUSED_CASES)
def test_silu_mul_linear(dtype, m, n, inter, cfg):
    torch.manual_seed(18)
    x, w = randn(m, 2 * inter, dtype=dtype, scale=2.0), randn(n, inter, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, inter)
    out = fused_linear.silu_mul_linear_with_config(x, w, cfg)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, fused_ref(x, w)) < TOL[dtype]
    unfused = linear.linear_with_config(activation.silu_and_mul(x), w, cfg)
    if INTERPRET:  # same activation values, same products in the same order
        assert torch.equal(out, unfused)
    else:
        assert rel_err(out, unfused) < TOL[dtype] / 4


def test_silu_mul_linear_dispatch(monkeypatch):
    torch.manual_seed(19)
    n, inter = 40, 96
    w = randn(n, inter, scale=0.1)
    calls = []
    real_fused = fused_linear.silu_mul_linear_with_config
    spy = lambda x, w, cfg: calls.append(cfg) or real_fused(x, w, cfg)
    monkeypatch.setattr(fused_linear, "silu_mul_linear_with_config", spy)

    def check(shape, fused_cfg):
        calls.clear()
        x = randn(*shape[:-1], 2 * inter, scale=2.0)
        out = fused_linear.silu_mul_linear(x, w)
        assert out.shape == (*shape[:-1], n)
        assert calls == ([fused_cfg] if fused_cfg else []), (shape, calls)
        if x.numel():
            assert rel_err(out, fused_ref(x.reshape(-1, 2 * inter), w).view(out.shape)) < TOL[torch.float32]

    use_tables(monkeypatch, tuning.DEFAULT)  # untuned: fused up to fused_m_max rows at the down config
    check((1, inter), linear.default_skinny_config(1, n, inter))
    check((2, 2, inter), linear.default_skinny_config(4, n, inter))
    check((5, inter), None)
    check((0, inter), None)
    # The down shape tuned for linear only: the fused kernel takes its config, where it has one.
    down = {1: SkinnyConfig(1, 16, 32, 2, 4, 1), 2: SkinnyConfig(16, 16, 32, 1, 4, 2)}
    use_tables(monkeypatch, TunedTables("test", linear={(n, inter): down}))
    check((1, inter), down[1])
    check((2, inter), down[2])
    check((3, inter), None)  # cuBLAS bucket for the down projection: unfused
    # A fused table overrides: its buckets only, at its configs.
    fused = {1: SkinnyConfig(1, 32, 64, 1, 4, 1), 8: SkinnyConfig(16, 32, 64, 2, 4, 2)}
    use_tables(monkeypatch, TunedTables("test", linear={(n, inter): down}, silu_mul_linear={(n, inter): fused}))
    check((1, inter), fused[1])
    check((2, inter), None)
    check((7, inter), fused[8])
    check((9, inter), None)
    assert fused_linear.silu_mul_linear_config(1, n, inter, TunedTables("t", fused_m_max=0)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul_linear_batch_invariant(row_invariant_dot, dtype):
    torch.manual_seed(20)
    n, inter = 80, 200
    x, w = randn(64, 2 * inter, dtype=dtype, scale=2.0), randn(n, inter, dtype=dtype, scale=0.1)
    full = fused_linear.silu_mul_linear_batch_invariant(x, w)
    assert rel_err(full, fused_ref(x, w)) < TOL[dtype]
    for rows in (1, 3, 16):
        assert torch.equal(fused_linear.silu_mul_linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(fused_linear.silu_mul_linear_batch_invariant(x[9:10], w), full[9:10])


def test_ops_silu_mul_linear():
    """torch Ops: exactly the unfused reference pair (the CPU path is unchanged bit for bit)."""
    torch.manual_seed(21)
    x, w = randn(5, 2 * 48), randn(32, 48)
    for inv in (False, True):
        ops = get_ops("torch", batch_invariant=inv)
        assert torch.equal(ops.silu_mul_linear(x, w), ops.linear(ops.silu_and_mul(x), w))
    assert get_ops("torch").silu_mul_linear is fused_linear.silu_mul_linear_ref


# --- fused residual add + RMSNorm + projection ------------------------------------------------------

NORM_CASES = [
    # m, n, k (weight [n, k], rows [m, k]), config
    (1, 48, 200, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # GEMV, K ragged against BLOCK_K
    (1, 40, 256, SkinnyConfig(1, 32, 64, 4, 4, 1)),  # GEMV, split-K: only split 0 of N tile 0 writes the sum
    (3, 64, 200, SkinnyConfig(16, 32, 64, 2, 4, 2)),  # dot path, split-K, ragged K
    (16, 72, 160, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # dot path, a full M tile, ragged N and K
    (20, 64, 128, SkinnyConfig(16, 32, 64, 2, 4, 2)),  # two M tiles (the second one ragged), split-K
    (3, 50, 96, None),  # the default heuristic's config
]


def norm_linear_ref(x, r, nw, eps, w):
    normed, summed = norm.add_rms_norm_ref(x, r, nw, eps)
    return linear.linear_ref(normed.float(), w.float()), summed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", NORM_CASES)
def test_add_rms_norm_linear(dtype, m, n, k, cfg):
    torch.manual_seed(24)
    x, r = randn(m, k, dtype=dtype, scale=2.0), randn(m, k, dtype=dtype)
    nw, w = randn(k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, k)
    y, summed = fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
    ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
    assert y.shape == (m, n) and y.dtype == dtype and summed.shape == (m, k)
    assert torch.equal(summed, ref_sum), "the residual sum is elementwise: it must match exactly"
    assert rel_err(y, ref) < TOL[dtype]
    # Against the unfused Triton pair at the same config: the only difference is the order of the
    # sum of squares (tiles of BLOCK_K vs one row-wide block), so it agrees to the dtype's tolerance.
    normed, summed2 = norm.add_rms_norm(x, r, nw, 1e-6)
    assert torch.equal(summed, summed2)
    assert rel_err(y, linear.linear_with_config(normed, w, cfg)) < TOL[dtype]


def test_add_rms_norm_linear_dispatch(monkeypatch):
    torch.manual_seed(25)
    n, k = 40, 96
    w, nw = randn(n, k, scale=0.1), randn(k)
    calls = []
    real = fused_linear.add_rms_norm_linear_with_config
    spy = lambda x, r, nw, eps, w, cfg: calls.append(cfg) or real(x, r, nw, eps, w, cfg)
    monkeypatch.setattr(fused_linear, "add_rms_norm_linear_with_config", spy)

    def check(shape, want_cfg):
        calls.clear()
        x, r = randn(*shape), randn(*shape)
        y, summed = fused_linear.add_rms_norm_linear(x, r, nw, 1e-5, w)
        assert y.shape == (*shape[:-1], n) and summed.shape == x.shape
        assert calls == ([want_cfg] if want_cfg else []), (shape, calls)
        if x.numel():
            ref, ref_sum = norm_linear_ref(x.reshape(-1, k), r.reshape(-1, k), nw, 1e-5, w)
            assert torch.equal(summed.reshape(-1, k), ref_sum)
            assert rel_err(y.reshape(-1, n), ref) < TOL[torch.float32]

    use_tables(monkeypatch, tuning.DEFAULT)  # never fused unless a table lists the shape
    for shape in [(1, k), (2, 2, k), (16, k), (0, k)]:
        check(shape, None)
    cfgs = {1: SkinnyConfig(1, 16, 32, 2, 4, 1), 4: SkinnyConfig(16, 16, 32, 2, 4, 2)}
    use_tables(monkeypatch, TunedTables("test", add_rms_norm_linear={(n, k): cfgs}))
    check((1, k), cfgs[1])
    check((2, k), None)  # bucket 2 missing: the unfused pair
    check((3, k), cfgs[4])
    check((2, 2, k), cfgs[4])
    check((5, k), None)
    use_tables(monkeypatch, TunedTables("test", norm_m_max=4))  # a file may turn it on for untuned shapes
    check((3, k), linear.default_skinny_config(3, n, k))
    check((5, k), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_linear_batch_invariant(row_invariant_dot, dtype):
    torch.manual_seed(26)
    n, k = 80, 200
    x, r = randn(64, k, dtype=dtype, scale=2.0), randn(64, k, dtype=dtype)
    nw, w = randn(k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    full, summed = fused_linear.add_rms_norm_linear_batch_invariant(x, r, nw, 1e-6, w)
    ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
    assert torch.equal(summed, ref_sum) and rel_err(full, ref) < TOL[dtype]
    for rows in (1, 3, 16):
        assert torch.equal(
            fused_linear.add_rms_norm_linear_batch_invariant(x[:rows], r[:rows], nw, 1e-6, w)[0], full[:rows]
        )


def test_ops_add_rms_norm_linear():
    """torch Ops: exactly add_rms_norm + linear (the CPU path is unchanged bit for bit)."""
    torch.manual_seed(27)
    x, r, nw, w = randn(5, 48), randn(5, 48), randn(48), randn(32, 48)
    for inv in (False, True):
        ops = get_ops("torch", batch_invariant=inv)
        normed, summed = ops.add_rms_norm(x, r, nw, 1e-6)
        y, summed2 = ops.add_rms_norm_linear(x, r, nw, 1e-6, w)
        assert torch.equal(y, ops.linear(normed, w)) and torch.equal(summed, summed2)
    assert get_ops("torch").add_rms_norm_linear is fused_linear.add_rms_norm_linear_ref


# --- activation, sampling -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (3, 200), (2, 2, 2 * 1100)])
def test_silu_and_mul(dtype, shape):
    torch.manual_seed(10)
    x = randn(*shape, dtype=dtype, scale=3.0)
    out, ref = activation.silu_and_mul(x), activation.silu_and_mul_ref(x)
    assert out.shape == ref.shape
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 300, 5000, 151936])
def test_argmax(dtype, vocab):
    torch.manual_seed(11)
    logits = randn(4, vocab, dtype=dtype)
    logits[1] = torch.randint(0, 3, (vocab,), device=DEV).to(dtype)  # many ties: lowest index wins
    logits[2] = float("-inf")  # torch returns 0
    logits[3, vocab // 2 :] = logits[3].max() + 1  # tie spanning chunks
    assert torch.equal(sampling.argmax(logits), sampling.argmax_ref(logits))
    assert sampling.argmax(logits[:0]).shape == (0,)


def test_accept_prefix():
    torch.manual_seed(12)
    for n, k in [(0, 4), (6, 0), (9, 1), (33, 4), (5, 16)]:
        targets = torch.randint(0, 3, (n, k + 1), device=DEV)
        noise = torch.randint(0, 3, (n, k), device=DEV)
        drafts = torch.where(torch.rand(n, k, device=DEV) < 0.7, targets[:, :k], noise)
        limits = torch.randint(0, k + 1, (n,), device=DEV)
        if n:
            drafts[0], limits[0] = targets[0, :k], k  # full acceptance
        for lim in (limits, limits.int()):
            ref = sampling.accept_prefix_ref(drafts, targets, lim)
            assert torch.equal(sampling.accept_prefix(drafts, targets, lim), ref)


def test_triton_ops_fields():
    for inv in (False, True):
        ops = get_ops("triton", batch_invariant=inv)
        assert ops.name == "triton"
        assert ops.linear is (linear.linear_batch_invariant if inv else linear.linear)
        assert ops.silu_mul_linear is (
            fused_linear.silu_mul_linear_batch_invariant if inv else fused_linear.silu_mul_linear
        )
        want = fused_linear.add_rms_norm_linear_batch_invariant if inv else fused_linear.add_rms_norm_linear
        assert ops.add_rms_norm_linear is want
        assert ops.paged_attention.keywords == {"batch_invariant": inv}
        assert ops.argmax is sampling.argmax and ops.rms_norm is norm.rms_norm


# --- GPU only ---------------------------------------------------------------------------------

QWEN3_4B = dict(hidden=2560, hq=32, hkv=8, d=128, inter=9728, vocab=151936)


@gpu
def test_gpu_4b_shapes():
    torch.manual_seed(13)
    g, bf = QWEN3_4B, torch.bfloat16
    x, r, w = randn(8, g["hidden"], dtype=bf), randn(8, g["hidden"], dtype=bf), randn(g["hidden"], dtype=bf)
    assert rel_err(norm.add_rms_norm(x, r, w, 1e-6)[0], norm.add_rms_norm_ref(x, r, w, 1e-6)[0]) < TOL[bf]
    t = 9
    qkv = randn(t, (g["hq"] + 2 * g["hkv"]) * g["d"], dtype=bf)
    q, k, v = qkv.split([g["hq"] * g["d"], g["hkv"] * g["d"], g["hkv"] * g["d"]], dim=1)
    q, k, v = (z.view(t, -1, g["d"]) for z in (q, k, v))
    cs = rope.rope_cos_sin(4096, g["d"], 1e6, DEV)
    pos, slots = torch.arange(100, 100 + t, device=DEV), torch.arange(t, device=DEV) * 7
    qw, kw = randn(g["d"], dtype=bf), randn(g["d"], dtype=bf)
    caches = [torch.zeros(8, 16, g["hkv"], g["d"], dtype=bf, device=DEV) for _ in range(4)]
    out = rope.qk_norm_rope_store(q, k, v, pos, slots, qw, kw, cs, caches[0], caches[1], 1e-6)
    ref = rope.qk_norm_rope_store_ref(q, k, v, pos, slots, qw, kw, cs, caches[2], caches[3], 1e-6)
    assert rel_err(out, ref) < TOL[bf] and rel_err(caches[0], caches[2]) < TOL[bf]
    for m in (1, 4, 16, 64):
        for n, kk in [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]:
            xm, wm = randn(m, kk, dtype=bf), randn(n, kk, dtype=bf, scale=0.05)
            assert rel_err(linear.linear(xm, wm), linear.linear_ref(xm.float(), wm.float())) < TOL[bf], (m, n, kk)
    logits = randn(16, g["vocab"], dtype=bf)
    assert torch.equal(sampling.argmax(logits), sampling.argmax_ref(logits))
    h = randn(16, 2 * g["inter"], dtype=bf)
    assert rel_err(activation.silu_and_mul(h), activation.silu_and_mul_ref(h)) < TOL[bf]


@gpu
def test_gpu_tuned_table():
    """This device's tuned file (if there is one) is what the kernels use, and every config in it
    computes the right thing at its own M bucket and weight shape (bf16)."""
    torch.manual_seed(22)
    device = torch.device(DEV, torch.cuda.current_device())
    path = tuning.tuned_path(torch.cuda.get_device_name(device))
    t = tuning.tables_for(device)
    assert t.source == (str(path) if path.is_file() else None), (t.source, path)
    bf = torch.bfloat16
    for op, table in (("linear", t.linear), ("silu_mul", t.silu_mul_linear), ("norm", t.add_rms_norm_linear)):
        for (n, k), per_m in table.items():
            w = randn(n, k, dtype=bf, scale=0.05)
            for bucket, cfg in per_m.items():
                for m in sorted({bucket // 2 + 1, bucket}) if cfg.block_m != 1 else [1]:
                    if op == "silu_mul":
                        x = randn(m, 2 * k, dtype=bf, scale=2.0)
                        out, ref = fused_linear.silu_mul_linear_with_config(x, w, cfg), fused_ref(x, w)
                    elif op == "norm":
                        x, r, nw = randn(m, k, dtype=bf), randn(m, k, dtype=bf), randn(k, dtype=bf)
                        (out, summed), (ref, ref_sum) = (
                            fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg),
                            norm_linear_ref(x, r, nw, 1e-6, w),
                        )
                        assert torch.equal(summed, ref_sum), (op, n, k, m, cfg)
                    else:
                        x = randn(m, k, dtype=bf)
                        out, ref = linear.linear_with_config(x, w, cfg), linear.linear_ref(x.float(), w.float())
                    assert rel_err(out, ref) < TOL[bf], (op, n, k, m, cfg)
            del w


@gpu
def test_gpu_silu_mul_linear_4b():
    """The fused SwiGLU + down op at the Qwen3-4B shape (2560 x 9728, bf16) as dispatched on this
    device (fused at small M, the unfused pair above), against the reference and the unfused pair;
    then captured in a CUDA graph and replayed on new inputs."""
    torch.manual_seed(23)
    bf, n, inter = torch.bfloat16, QWEN3_4B["hidden"], QWEN3_4B["inter"]
    w = randn(n, inter, dtype=bf, scale=0.05)
    t = tuning.tables_for(w.device)
    for m in (1, 2, 3, 4, 8, 16, 32, 64):
        x = randn(m, 2 * inter, dtype=bf, scale=2.0)
        ref = fused_ref(x, w)
        out = fused_linear.silu_mul_linear(x, w)
        assert rel_err(out, ref) < TOL[bf], m
        cfg = fused_linear.silu_mul_linear_config(m, n, inter, t) or linear.default_skinny_config(m, n, inter)
        fused = fused_linear.silu_mul_linear_with_config(x, w, cfg)
        assert rel_err(fused, ref) < TOL[bf], (m, cfg)
        assert rel_err(fused, linear.linear_with_config(activation.silu_and_mul(x), w, cfg)) < TOL[bf] / 4, (m, cfg)
    for m in (1, 4):
        x = randn(m, 2 * inter, dtype=bf, scale=2.0)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fused_linear.silu_mul_linear(x, w)  # compile + load the tables outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_linear.silu_mul_linear(x, w)
        for _ in range(2):
            x.copy_(randn(m, 2 * inter, dtype=bf, scale=2.0))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(out, fused_ref(x, w)) < TOL[bf], m


@gpu
@pytest.mark.parametrize("n", [6144, 19456])
def test_gpu_add_rms_norm_linear_4b(n):
    """The add + RMSNorm prologue at the Qwen3-4B q|k|v and gate|up shapes (bf16): at the table's
    config (or the default one) for M = 1..16 vs the reference (the residual sum exactly), the
    dispatched op, then a CUDA-graph capture replayed on new inputs."""
    torch.manual_seed(24)
    bf, k = torch.bfloat16, QWEN3_4B["hidden"]
    w, nw = randn(n, k, dtype=bf, scale=0.05), randn(k, dtype=bf)
    t = tuning.tables_for(w.device)
    for m in (1, 2, 3, 4, 8, 16):
        x, r = randn(m, k, dtype=bf, scale=2.0), randn(m, k, dtype=bf)
        ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
        cfg = fused_linear.add_rms_norm_linear_config(m, n, k, t) or linear.default_skinny_config(m, n, k)
        y, summed = fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
        assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], (m, cfg)
        y, summed = fused_linear.add_rms_norm_linear(x, r, nw, 1e-6, w)
        assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], m
    for m in (1, 4):
        x, r = randn(m, k, dtype=bf, scale=2.0), randn(m, k, dtype=bf)
        cfg = linear.default_skinny_config(m, n, k)
        run = lambda x=x, r=r, cfg=cfg: fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, summed = run()
        for _ in range(2):
            x.copy_(randn(m, k, dtype=bf, scale=2.0))
            r.copy_(randn(m, k, dtype=bf))
            graph.replay()
            torch.cuda.synchronize()
            ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
            assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], m


@gpu
@pytest.mark.parametrize(
    "spans,ctxs",
    [([1] * 8, [2047, 900, 15, 0, 1500, 256, 33, 1024]), ([1], [8000]), ([9, 9, 1], [600, 1800, 40]), ([64], [300])],
)
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_attention_4b(spans, ctxs, causal):
    torch.manual_seed(14)
    g = QWEN3_4B
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, g["hq"], g["hkv"], g["d"], torch.bfloat16)
    out = attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, g["d"] ** -0.5, causal)
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, g["d"] ** -0.5, causal)
    assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16]


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_attention_batch_invariant_bitexact(causal):
    torch.manual_seed(15)
    g = QWEN3_4B
    _invariance_check(torch.bfloat16, g["hq"], g["hkv"], g["d"], causal)


@gpu
@pytest.mark.parametrize("n,k", [(6144, 2560), (2560, 9728), (151936, 2560)])
def test_gpu_linear_batch_invariant_bitexact(n, k):
    torch.manual_seed(16)
    x, w = randn(64, k, dtype=torch.bfloat16), randn(n, k, dtype=torch.bfloat16, scale=0.05)
    full = linear.linear_batch_invariant(x, w)
    for rows in (1, 7, 16, 33):
        assert torch.equal(linear.linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(linear.linear_batch_invariant(x[9:10], w), full[9:10])


@gpu
@pytest.mark.parametrize("spans,causal", [([1, 1], True), ([9, 9], True), ([16], False)])
def test_gpu_attention_graph_replay(spans, causal):
    """Capture once, then replay with new seq_lens and q: the kernel reads every bound on device."""
    torch.manual_seed(17)
    g = QWEN3_4B
    scale = g["d"] ** -0.5
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, [3000] * len(spans), g["hq"], g["hkv"], g["d"], torch.bfloat16)
    run = lambda: attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, scale, causal)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile + warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for ctx in ([5, 2000], [1500, 17], [3000, 0], [63, 64]):
        ctx = ctx[: len(spans)]
        seq.copy_(torch.tensor([c + s for c, s in zip(ctx, spans, strict=True)], dtype=torch.int32, device=DEV))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, scale, causal)
        assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16], ctx


# --- the kernel bench's sweep -> tuned table path (CPU dry run) ------------------------------------


@pytest.mark.skipif(CUDA, reason="a CPU dry run of the bench plumbing; on a GPU run the bench itself")
def test_bench_write_tuned_dry_run(monkeypatch, tmp_path):
    """engine.bench.kernels end to end on tiny shapes under the interpreter with a fake timer: the
    sweep, the fused sweep, the report and --write-tuned (merge over the existing file)."""
    from engine.bench import kernel_cases as cases
    from engine.bench import kernels as bench

    qkv, down, head = (64, 32), (32, 96), (200, 32)
    monkeypatch.setattr(cases, "SHAPES", [qkv, down, head])
    monkeypatch.setattr(cases, "SHAPE_NAMES", {qkv: "qkv", down: "down", head: "lm_head"})
    monkeypatch.setattr(cases, "EXTENDED_SHAPES", {down})
    monkeypatch.setattr(cases, "DOWN_SHAPE", down)
    monkeypatch.setattr(cases, "NORM_SHAPES", [qkv])
    monkeypatch.setattr(cases, "DEVICE", DEV)
    monkeypatch.setattr(cases, "DTYPE", torch.float32)
    monkeypatch.setattr(cases, "ROTATE_BYTES", 1)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: 4200.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Dry Run GPU")
    monkeypatch.setattr(tuning, "TUNED_DIR", tmp_path / "pkg")
    monkeypatch.setattr(tuning, "_by_device", {})

    def fake_timer(fn, variants, est_us):  # runs the op; the time favours the fused GEMV and split 2
        fn(0)
        cfg = next((c for c in getattr(fn, "__defaults__", None) or () if isinstance(c, SkinnyConfig)), None)
        if cfg is None:
            return 10.0
        fused = {"silu_mul_linear_with_config", "add_rms_norm_linear_with_config"} & set(fn.__code__.co_names)
        gemv = cfg.block_m == 1
        return 9.0 - (cfg.split_k == 2) - 0.5 * gemv - bool(fused and gemv) + 0.01 * cfg.block_n

    monkeypatch.setattr(bench, "Timer", lambda kind: fake_timer)
    old = TunedTables(
        "dry-run-gpu",
        m_max=8,
        linear={head: {1: SkinnyConfig(1, 16, 32, 1, 4, 1)}, (7, 7): {1: SkinnyConfig(1, 16, 32, 1, 4, 1)}},
    )
    (tmp_path / "pkg").mkdir()
    tuning.tuned_path("Dry Run GPU").write_text(tuning.dumps(old, "Dry Run GPU"))
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--ms", "1,2,32", "--skip", "invariant,attention", "--write-tuned"])
    assert rc == 0
    report = (out / "report.md").read_text()
    assert "silu_mul_linear" in report and "add_rms_norm_linear" in report and "Tuned table written" in report
    written = (out / "tuned" / "dry-run-gpu.json").read_text()
    assert written == tuning.tuned_path("Dry Run GPU").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tuning.load("Dry Run GPU")
    # Triton "wins" everywhere at 9-ish us against cuBLAS's 10: the best candidate per bucket.
    assert t.linear[down][1] == SkinnyConfig(1, 8, 512, 2, 4, 1)  # an extended GEMV point, split 2
    assert t.linear[qkv][1].block_m == 1 and t.linear[qkv][1].split_k == 2
    assert set(t.linear[qkv]) == {1, 2, 32} and t.linear[qkv][32].block_m == 32
    assert t.linear[(7, 7)] == old.linear[(7, 7)]  # not measured: kept
    assert t.m_max == 8  # a partial --ms keeps the old m_max
    assert set(t.silu_mul_linear[down]) == {1}  # the fused GEMV beats the unfused pair at M = 1 only
    assert t.silu_mul_linear[down][1].block_m == 1
    assert set(t.add_rms_norm_linear[qkv]) == {1} and t.add_rms_norm_linear[qkv][1] == t.linear[qkv][1]
    import csv

    rows = list(csv.DictReader((out / "silu_mul_linear.csv").open()))
    assert {r["M"] for r in rows} == {"1", "2"} and {"fused", "silu_and_mul+cublas"} <= {r["impl"] for r in rows}
