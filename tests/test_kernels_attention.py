"""Paged attention against its torch reference: ragged spans, decode splits, padded launches,
batch invariance; on a GPU the Qwen3-4B heads in bf16 and CUDA-graph replay (setup and tolerance
policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import _triton, attention
from tests.kernel_helpers import (
    ATTN_TOL,
    DEV,
    DTYPES,
    QWEN3_4B,
    capture_graph,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    rel_err,
    row_invariant_dot,  # noqa: F401 (fixture, requested by name)
)


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


@pytest.mark.usefixtures("row_invariant_dot")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 32), (4, 4, 16)])
def test_paged_attention_batch_invariant(causal, hq, hkv, d):
    torch.manual_seed(6)
    _invariance_check(torch.float32, hq, hkv, d, causal)


def test_long_keys_use_the_extra_splits(monkeypatch):
    """A split decode launches twice its splits; a sequence past SPLIT_KEYS keys a split uses them (up to
    all), a short one its usual share, and both equal the reference (the unused splits are empty)."""
    monkeypatch.setattr(attention, "SPLIT_KEYS", 32)
    torch.manual_seed(21)
    q, kc, vc, bt, seq, qsl, mq = make_paged([1, 1], [600, 20], 2, 1, 16, torch.float32)
    cfg = attention.attention_config(2, 1, 2, 1, bt.shape[1] * 16, q.device, False)
    assert cfg[3:] == (2 * cfg[4], cfg[4]) and cfg[4] > 1
    out = attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, 16**-0.5, True)
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, 16**-0.5, True)
    assert rel_err(out, ref) < ATTN_TOL[torch.float32]


# --- GPU only -----------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize(
    "spans,ctxs",
    [
        ([1] * 8, [2047, 900, 15, 0, 1500, 256, 33, 1024]),
        ([1], [8000]),
        ([9, 9, 1], [600, 1800, 40]),
        ([64], [300]),
        ([1] * 64, [191] * 63 + [0]),  # the wide decode tile (no splits: the grid is full)
    ],
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
@pytest.mark.parametrize("spans,causal", [([1, 1], True), ([9, 9], True), ([16], False)])
def test_gpu_attention_graph_replay(spans, causal):
    """Capture once, then replay with new seq_lens and q: the kernel reads every bound on device."""
    torch.manual_seed(17)
    g = QWEN3_4B
    scale = g["d"] ** -0.5
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, [3000] * len(spans), g["hq"], g["hkv"], g["d"], torch.bfloat16)
    run = lambda: attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, scale, causal)
    graph, out = capture_graph(run)  # compiled + warmed up outside the capture
    for ctx in ([5, 2000], [1500, 17], [3000, 0], [63, 64]):
        ctx = ctx[: len(spans)]
        seq.copy_(torch.tensor([c + s for c, s in zip(ctx, spans, strict=True)], dtype=torch.int32, device=DEV))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref = attention.paged_attention_ref(q, kc, vc, bt, seq, qsl, mq, scale, causal)
        assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16], ctx


@gpu
@pytest.mark.parametrize(
    "spans,ctxs,causal",
    [
        ([1] * 64, [191] * 63 + [0], True),  # the wide decode tile
        ([1] * 8, [2047, 900, 15, 0, 1500, 256, 33, 1024], True),  # split decode
        ([9, 9, 1], [600, 1800, 40], True),  # verify spans: the span's rows are not prefetched
        ([16, 16], [300, 5], False),  # the drafter's block
    ],
)
def test_gpu_early_kv_prefetch_changes_no_output(spans, ctxs, causal, monkeypatch):
    """The first key tile pulled into L2 before the PDL wait is a hint, and the bounds read before it
    are those after it: eagerly and replayed from a graph, the output is bit-identical to a launch
    without PDL (no wait, no prefetch)."""
    torch.manual_seed(18)
    g = QWEN3_4B
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, g["hq"], g["hkv"], g["d"], torch.bfloat16)
    run = lambda: attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, g["d"] ** -0.5, causal)
    outs = []
    for limit in (-1, _triton.PDL_MAX_ROWS):  # -1: no launch with PDL
        monkeypatch.setattr(_triton, "PDL_MAX_ROWS", limit)
        graph, out = capture_graph(run)
        graph.replay()
        torch.cuda.synchronize()
        outs += [run().clone(), out.clone()]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_split_decodes_of_two_or_more_sequences_pipeline_deeper():
    assert attention.attention_stages(8, 1, 2) == attention.SPLIT_STAGES == 3
    assert attention.attention_stages(1, 1, 4) == attention.NUM_STAGES == 2  # one sequence: measured slower
    assert attention.attention_stages(64, 1, 1) == attention.NUM_STAGES  # no splits: the wide tile
    assert attention.attention_stages(8, 4, 2) == attention.NUM_STAGES  # verify spans: not measured


@gpu
def test_gpu_split_decode_pipeline_depth_changes_no_output(monkeypatch):
    """Eight sequences of split decode (SPLIT_STAGES) give the same bits at two and three stages."""
    torch.manual_seed(19)
    g = QWEN3_4B
    spans, ctxs = [1] * 8, [2047, 900, 15, 0, 1500, 256, 33, 1024]
    q, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, g["hq"], g["hkv"], g["d"], torch.bfloat16)
    outs = []
    for stages in (2, 3):
        monkeypatch.setattr(attention, "SPLIT_STAGES", stages)
        outs.append(attention.paged_attention(q, kc, vc, bt, seq, qsl, mq, g["d"] ** -0.5, True))
    assert torch.equal(outs[0], outs[1])
