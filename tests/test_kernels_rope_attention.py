"""QK-norm + RoPE + KV store + paged attention: the decode launch that does all four (rope_attention)
against the two-launch path and the torch reference, on caches whose new rows are poisoned, so a
program that read the new key or value from the cache instead of its registers shows NaN. The fused
launch adds the new row as one online-softmax step after its key loop (its score a sum, not part of a
tile's tl.dot), so the two paths agree within rounding, not bit for bit; the stored rows are equal."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import rope, rope_attention
from tests.kernel_helpers import ATTN_TOL, DEV, DTYPES, QWEN3_4B, capture_graph, gpu, randn, rel_err
from tests.test_kernels_attention import make_paged


def decode_case(ctxs, hq, hkv, d, dtype, stored=None, spans=None):
    """One decode step: raw q|k|v rows, caches with each new row NaN where it will be stored, and
    the metadata; `stored[b]` False gives sequence b slot -1 (a padded row: its cache row is read)."""
    spans = spans or [1] * len(ctxs)
    _, kc, vc, bt, seq, qsl, mq = make_paged(spans, ctxs, hq, hkv, d, dtype)
    t, page = int(qsl[-1]), kc.shape[1]
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, scale=2.0)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    positions, slots = [], []
    for b, (ctx, span) in enumerate(zip(ctxs, spans, strict=True)):
        for pos in range(ctx, ctx + span):
            slot = int(bt[b, pos // page]) * page + pos % page
            keep = stored is None or stored[b]
            if keep:
                kc.view(-1, hkv, d)[slot] = float("nan")
                vc.view(-1, hkv, d)[slot] = float("nan")
            positions.append(pos)
            slots.append(slot if keep else -1)
    positions = torch.tensor(positions, device=DEV)
    slots = torch.tensor(slots, device=DEV)
    cos_sin = rope.rope_cos_sin(max(seq.tolist()) + 1, d, 1e6, DEV)
    qw, kw = randn(d, dtype=dtype), randn(d, dtype=dtype)
    head = (q, k, v, positions, slots, qw, kw, cos_sin)
    return head, (kc, vc), (bt, seq, qsl, mq)


def run(fn, head, caches, meta, d, causal=True, batch_invariant=False):
    kc, vc = (c.clone() for c in caches)
    out = fn(*head, kc, vc, 1e-6, *meta, d**-0.5, causal, batch_invariant)
    return out, kc, vc


def both_paths(monkeypatch, head, caches, meta, d, **kw):
    """(fused, two launches, reference): each (out, k cache, v cache)."""
    fused = run(rope_attention.qk_norm_rope_attention, head, caches, meta, d, **kw)
    monkeypatch.setattr(rope_attention, "FUSE_DECODE", False)
    pair = run(rope_attention.qk_norm_rope_attention, head, caches, meta, d, **kw)
    return fused, pair, run(rope_attention.qk_norm_rope_attention_ref, head, caches, meta, d, **kw)


DECODE_CASES = [
    # cached context before each new row, hq, hkv, d, stored (None: every row)
    ([5, 17, 40, 0], 4, 2, 32, None),  # page boundaries, a first token
    ([60, 15, 0], 4, 1, 16, [True, False, True]),  # a padded row reads its cache row
    ([100, 33], 2, 2, 64, None),  # MHA, flash-decoding splits (the interpreter's 4 SMs)
    ([200], 4, 2, 128, None),  # head_dim 128, auto split
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ctxs,hq,hkv,d,stored", DECODE_CASES)
def test_decode_fused_matches_two_launches(monkeypatch, dtype, ctxs, hq, hkv, d, stored):
    torch.manual_seed(21)
    head, caches, meta = decode_case(ctxs, hq, hkv, d, dtype, stored)
    (out, kc, vc), (out2, kc2, vc2), (ref, kc_ref, vc_ref) = both_paths(monkeypatch, head, caches, meta, d)
    assert rel_err(out, out2) < ATTN_TOL[dtype] and rel_err(out, ref) < ATTN_TOL[dtype]
    assert torch.equal(kc.nan_to_num(-7), kc2.nan_to_num(-7)) and torch.equal(vc.nan_to_num(-7), vc2.nan_to_num(-7))
    assert torch.equal(kc.isnan(), kc_ref.isnan()), "stored slots differ from the reference's"


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_fused_every_split(monkeypatch, splits):
    """Forced split counts: the new row is read from registers by whichever split holds it."""
    torch.manual_seed(22)
    head, caches, meta = decode_case([70, 9, 31], 4, 2, 32, torch.float32)
    monkeypatch.setattr("engine.kernels.attention.attention_config", lambda *a: (4, 16, 16, splits))
    (out, kc, _), (out2, kc2, _), (ref, _, _) = both_paths(monkeypatch, head, caches, meta, 32)
    assert torch.equal(kc.nan_to_num(-7), kc2.nan_to_num(-7))
    assert rel_err(out, out2) < ATTN_TOL[torch.float32] and rel_err(out, ref) < ATTN_TOL[torch.float32]


def test_spans_keep_two_launches(monkeypatch):
    """A verify span (max_query_len > 1) and an empty sequence: the two-launch path, as the reference."""
    torch.manual_seed(23)
    head, caches, meta = decode_case([12, 30, 5], 4, 2, 32, torch.float32, spans=[3, 1, 0])
    calls = []
    monkeypatch.setattr(rope_attention, "qk_norm_rope_store", lambda *a: calls.append(1) or rope.qk_norm_rope_store(*a))
    out, kc, _ = run(rope_attention.qk_norm_rope_attention, head, caches, meta, 32)
    ref, kc_ref, _ = run(rope_attention.qk_norm_rope_attention_ref, head, caches, meta, 32)
    assert calls == [1]
    assert torch.equal(kc.isnan(), kc_ref.isnan()) and rel_err(out, ref) < ATTN_TOL[torch.float32]


def test_batch_invariant_mode_keeps_two_launches(monkeypatch):
    """Batch-invariant mode: the two launches at decode too (a decode row must round as the same row of
    a span does), and a row's output is the same bits alone or in a batch."""
    torch.manual_seed(24)
    head, caches, (bt, seq, _, mq) = decode_case([40, 7, 90], 4, 2, 32, torch.float32)
    calls = []
    monkeypatch.setattr(rope_attention, "qk_norm_rope_store", lambda *a: calls.append(1) or rope.qk_norm_rope_store(*a))
    batch = run(rope_attention.qk_norm_rope_attention, head, caches, (bt, seq, _, mq), 32, batch_invariant=True)[0]
    assert calls == [1]
    one = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    for b in range(3):
        alone_head = tuple(t[b : b + 1] if t.dim() and t.shape[0] == 3 else t for t in head)
        meta = (bt[b : b + 1], seq[b : b + 1], one, mq)
        alone = run(rope_attention.qk_norm_rope_attention, alone_head, caches, meta, 32, batch_invariant=True)[0]
        assert torch.equal(alone[0], batch[b]), b


# --- GPU only -----------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("ctxs", [[2047, 900, 15, 0, 1500, 256, 33, 1024], [8000], [191] * 64])
def test_gpu_decode_fused_4b(monkeypatch, ctxs):
    torch.manual_seed(25)
    g = QWEN3_4B
    head, caches, meta = decode_case(ctxs, g["hq"], g["hkv"], g["d"], torch.bfloat16)
    (out, kc, vc), (out2, kc2, vc2), (ref, kc_ref, _) = both_paths(monkeypatch, head, caches, meta, g["d"])
    assert torch.equal(kc.nan_to_num(-7), kc2.nan_to_num(-7)) and torch.equal(vc.nan_to_num(-7), vc2.nan_to_num(-7))
    assert rel_err(out, out2) < ATTN_TOL[torch.bfloat16]
    assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16]


@gpu
def test_gpu_decode_fused_graph_replay():
    """Captured once, replayed at new positions: every bound and slot is read on the device."""
    torch.manual_seed(26)
    g = QWEN3_4B
    head, (kc, vc), meta = decode_case([3000, 3000], g["hq"], g["hkv"], g["d"], torch.bfloat16)
    q, k, v, positions, slots, qw, kw, cos_sin = head
    bt, seq, _, _ = meta
    cos_sin = rope.rope_cos_sin(4096, g["d"], 1e6, DEV)
    fused = lambda: rope_attention.qk_norm_rope_attention(  # noqa: E731
        q, k, v, positions, slots, qw, kw, cos_sin, kc, vc, 1e-6, *meta, g["d"] ** -0.5
    )
    graph, out = capture_graph(fused)
    page = kc.shape[1]
    for ctx in ([5, 2000], [1500, 17], [63, 64]):
        pos = torch.tensor(ctx, device=DEV)
        positions.copy_(pos)
        seq.copy_((pos + 1).int())
        slots.copy_(torch.stack([bt[b, p // page].long() * page + p % page for b, p in enumerate(ctx)]))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        kc_ref, vc_ref = kc.clone(), vc.clone()
        graph.replay()
        torch.cuda.synchronize()
        head = (q, k, v, positions, slots, qw, kw, cos_sin)
        ref = rope_attention.qk_norm_rope_attention_ref(*head, kc_ref, vc_ref, 1e-6, *meta, g["d"] ** -0.5)
        assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16], ctx
        assert torch.equal(kc.isnan(), kc_ref.isnan()), ctx
        assert rel_err(kc.nan_to_num(0), kc_ref.nan_to_num(0)) < ATTN_TOL[torch.bfloat16], ctx
