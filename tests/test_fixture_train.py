"""Training smoke tests on a micro geometry: target and drafter losses fall in a few CPU steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.fixture.recipes import MICRO
from engine.fixture.train_drafter import DrafterData, drafter_loss, make_drafter, make_greedy_pool, train_drafter
from engine.fixture.train_target import eval_loss, make_target, train_target

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def stream():
    # A repetitive synthetic "code" stream: learnable in a handful of steps.
    gen = torch.Generator().manual_seed(0)
    motifs = torch.randint(2, MICRO.vocab_size, (12, 9), generator=gen)
    order = torch.randint(0, 12, (800,), generator=gen)
    return motifs[order].flatten().to(torch.int32)


@pytest.fixture(scope="module")
def trained_target(stream):
    r = dataclasses.replace(MICRO, target_steps=40, target_lr=1e-2, log_every=1000)
    model = make_target(r, eos_id=0, seed=0)
    before = eval_loss(model, stream[:2000], r.seq_len)
    train_target(model, stream, r, CPU, seed=0)
    after = eval_loss(model, stream[:2000], r.seq_len)
    return model, before, after


def test_target_loss_falls(trained_target):
    _, before, after = trained_target
    assert after < before - 1.0, (before, after)


def test_drafter_loss_falls(trained_target, stream):
    target, _, _ = trained_target
    r = dataclasses.replace(MICRO, drafter_steps=30, drafter_lr=5e-3, greedy_sequences=16, log_every=1000)
    target.requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    pool = make_greedy_pool(target, stream, r, gen)
    assert pool.shape == (16, r.drafter_seq_len)
    data = DrafterData(pool, r.greedy_prompt_len, stream, r)
    drafter = make_drafter(r, 1, target, seed=0)

    def measure() -> float:
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            total = 0.0
            for _ in range(4):
                seqs, lo, feats = data.sample(g)
                total += float(drafter_loss(drafter, target, seqs, lo, 4, r.loss_gamma, g, feats)[0])
            return total

    before = measure()
    train_drafter(drafter, target, data, r, CPU, seed=0)
    after = measure()
    assert after < 0.8 * before, (before, after)
    assert all(not p.requires_grad for p in target.parameters())


def test_greedy_pool_is_target_greedy(trained_target, stream):
    """Pool rows continue their prompt with the target's own argmax tokens."""
    from engine.fixture.reference import plain_generate

    target, _, _ = trained_target
    r = dataclasses.replace(MICRO, greedy_sequences=2)
    pool = make_greedy_pool(target, stream, r, torch.Generator().manual_seed(5))
    for row in pool.tolist():
        prompt = row[: r.greedy_prompt_len]
        assert row[r.greedy_prompt_len :] == plain_generate(target, prompt, r.greedy_new_tokens)


def test_precomputed_features_match_on_the_fly(trained_target, stream):
    from engine.fixture.train_drafter import target_features

    target, _, _ = trained_target
    r = dataclasses.replace(MICRO, greedy_sequences=6)
    pool = make_greedy_pool(target, stream, r, torch.Generator().manual_seed(9))
    feats = target_features(target, pool, r.target_layer_ids, batch=4)
    drafter = make_drafter(r, 1, target, seed=0)
    data = DrafterData(pool, r.greedy_prompt_len, stream, r, features=feats)
    seqs, lo, f = data.sample(torch.Generator().manual_seed(3))
    assert f is not None and f.shape[:2] == seqs.shape
    with torch.no_grad():
        pre = drafter_loss(drafter, target, seqs, lo, 4, r.loss_gamma, torch.Generator().manual_seed(4), f)[0]
        fly = drafter_loss(drafter, target, seqs, lo, 4, r.loss_gamma, torch.Generator().manual_seed(4))[0]
    torch.testing.assert_close(pre, fly, rtol=1e-5, atol=1e-5)
