"""The DFlash training mask and anchor sampling: no leakage across the anchor or between blocks."""

from __future__ import annotations

import torch

from engine.fixture.train_drafter import dflash_mask, sample_anchors


def test_mask_semantics_exhaustive():
    B, L = 4, 20
    anchors = torch.tensor([[1, 5, 6, 16], [0, 3, 9, 12]])
    m = dflash_mask(anchors, L, B)
    N = anchors.shape[1]
    assert m.shape == (2, N * B, L + N * B) and m.dtype == torch.bool
    for b in range(2):
        for q in range(N * B):
            n = q // B
            a = int(anchors[b, n])
            for kv in range(L):
                # context strictly before the anchor: never the anchor's own row or later ones
                assert bool(m[b, q, kv]) == (kv < a), (b, q, kv)
            for j in range(N * B):
                # bidirectional within its own block, blind to every other block
                assert bool(m[b, q, L + j]) == (j // B == n), (b, q, j)


def test_no_row_is_fully_masked():
    anchors = torch.tensor([[0, 2]])
    assert dflash_mask(anchors, 8, 3).any(dim=-1).all()


def test_sample_anchors_range_and_distinct():
    gen = torch.Generator().manual_seed(0)
    lo = torch.tensor([1, 10, 30])
    L, B, n = 48, 8, 8
    for _ in range(20):
        a = sample_anchors(lo, L, B, n, gen)
        assert a.shape == (3, n)
        for row, low in zip(a.tolist(), lo.tolist(), strict=True):
            assert row == sorted(set(row)) and len(row) == n
            assert all(low <= p <= L - B for p in row)


def test_drafter_block_ignores_context_at_and_after_anchor():
    """End to end through the module: perturbing features at/after a block's anchor, or another
    block's tokens, leaves that block's outputs unchanged."""
    from engine.fixture.recipes import MICRO
    from engine.fixture.train_drafter import make_drafter

    torch.manual_seed(0)
    d = make_drafter(MICRO, 1, None, 0).eval()
    H, L, B = MICRO.hidden_size, 16, MICRO.block_size
    anchors = torch.tensor([[4, 9]])
    ctx = torch.randn(1, L, H)
    blocks = torch.randn(1, 2 * B, H)
    pos = (anchors[:, :, None] + torch.arange(B)).flatten(1)
    ctx_pos = torch.arange(L)[None]
    mask = dflash_mask(anchors, L, B)
    base = d(blocks, ctx, pos, ctx_pos, mask)
    ctx2 = ctx.clone()
    ctx2[:, 4:] += torch.randn(1, L - 4, H)  # at/after block 0's anchor
    blocks2 = blocks.clone()
    blocks2[:, B:] += torch.randn(1, B, H)  # block 1's inputs
    out = d(blocks2, ctx2, pos, ctx_pos, mask)
    torch.testing.assert_close(out[:, :B], base[:, :B])
    ctx3 = ctx.clone()
    ctx3[:, 3] += 1.0  # a row block 0 may see
    assert not torch.allclose(d(blocks, ctx3, pos, ctx_pos, mask)[:, :B], base[:, :B])


def test_training_forward_equals_inference_forward():
    """A block in the batched, masked training forward gives the same hidden states as the
    inference call for that anchor alone (context = rows before the anchor, no mask)."""
    from engine.fixture.features import tap
    from engine.fixture.recipes import MICRO
    from engine.fixture.train_drafter import make_drafter
    from engine.fixture.train_target import make_target

    target = make_target(MICRO, 0, seed=0).eval()
    d = make_drafter(MICRO, 1, target, 0).eval()
    cfg, B, L = d.cfg, MICRO.block_size, 24
    seq = torch.randint(2, MICRO.vocab_size, (1, L), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[2, 5, 6, 13, 20]])
    with torch.no_grad():
        feats = tap(target.model(input_ids=seq, output_hidden_states=True).hidden_states, cfg.target_layer_ids)
        pos = anchors[:, :, None] + torch.arange(B)
        blk = torch.full(pos.shape, cfg.mask_token_id)
        blk[..., 0] = seq[0, anchors[0]]
        emb = target.get_input_embeddings()(blk.flatten(1))
        ctx = d.project_context(feats)
        train = d(emb, ctx, pos.flatten(1), torch.arange(L)[None], dflash_mask(anchors, L, B))
        train = train.view(1, -1, B, ctx.shape[-1])
        for n, a in enumerate(anchors[0].tolist()):
            inf = d(emb[:, n * B : (n + 1) * B], ctx[:, :a], pos[:, n], torch.arange(a)[None])
            torch.testing.assert_close(train[:, n], inf, rtol=1e-5, atol=1e-5)
