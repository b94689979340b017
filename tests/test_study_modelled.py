"""The modelled drafter: acceptance profiles, and the engine's rounds accepting where the model says
while the target still verifies (outputs stay the known continuation)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.known.geometry import random_prompts
from engine.fixture.known.modelled import (
    AcceptanceProfile,
    ModelledDrafter,
    linear_profile,
    mixed_profile,
    parse_profile,
    parse_profiles,
)
from engine.fixture.known.target import echo_failures, known_pair
from engine.policy.costs import expected_committed

pytestmark = pytest.mark.usefixtures("one_thread")

# The eval block of a fixture manifest as engine/fixture/build.py writes it (small-f7c930c, first 4).
EVAL = {"block_size": 16, "tau": 4.33, "acceptance_by_position": [0.6757, 0.4907, 0.3827, 0.2894], "rounds": 704}


def test_linear_profiles_run_from_position_1_to_15():
    code, chat = parse_profile("code"), parse_profile("chat")
    assert len(code.conditional) == 15
    assert (code.conditional[0], code.conditional[-1]) == (0.87, 0.78)
    assert (chat.conditional[0], chat.conditional[-1]) == (0.72, 0.63)
    assert code.conditional[7] == pytest.approx((0.87 + 0.78) / 2)
    assert code.unconditional()[1] == pytest.approx(code.conditional[0] * code.conditional[1])
    assert code.first(4).conditional == code.conditional[:4]
    with pytest.raises(ValueError, match="covers 15"):
        code.first(16)


def test_measured_profile_from_a_pair_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": "small", "eval": EVAL}))
    got = parse_profile(f"measured:{tmp_path}")
    assert got.name == f"measured:{tmp_path.name}"
    assert got.unconditional() == pytest.approx(EVAL["acceptance_by_position"])
    assert parse_profile(f"measured:{tmp_path / 'manifest.json'}").conditional == got.conditional


@pytest.mark.parametrize(
    "spec, match",
    [("math", "expected one of"), ("measured:", "expected one of"), ("measured:/nonexistent", "no manifest")],
)
def test_bad_profile_names_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_profile(spec)


def test_malformed_manifests_are_refused(tmp_path):
    path = tmp_path / "manifest.json"
    for body in ("{", json.dumps({"eval": {}}), json.dumps({"eval": {"acceptance_by_position": [1.5]}})):
        path.write_text(body)
        with pytest.raises(ValueError, match="acceptance_by_position"):
            parse_profile(f"measured:{path}")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        AcceptanceProfile("bad", (0.5, 1.2))


def test_a_mixed_profile_holds_its_classes_and_pools_their_rates_by_survival():
    mixed, code, chat = parse_profile("code+chat"), parse_profile("code"), parse_profile("chat")
    assert (
        mixed.name == "code+chat"
        and mixed.classes == (code, chat)
        and mixed.rates() == [code.conditional, chat.conditional]
    )
    assert mixed.conditional[0] == pytest.approx((0.87 + 0.72) / 2)  # every request-round tries position 1
    reach = (code.conditional[0], chat.conditional[0])  # position 2: the rounds that accepted position 1
    pooled = (reach[0] * code.conditional[1] + reach[1] * chat.conditional[1]) / sum(reach)
    assert mixed.conditional[1] == pytest.approx(pooled, abs=1e-6) and mixed.conditional[1] > (0.87 + 0.72) / 2 - 0.01
    assert [c.conditional for c in mixed.first(4).classes] == [code.conditional[:4], chat.conditional[:4]]
    assert mixed.first(4).conditional == mixed.conditional[:4]
    assert mixed.record() == {
        "pooled": list(mixed.conditional),
        "classes": {"code": list(code.conditional), "chat": list(chat.conditional)},
    }
    assert code.record() == list(code.conditional) and code.rates() == [code.conditional]
    same = mixed_profile("x", [linear_profile("a", 0.6, 0.5)] * 3)  # alike classes pool to themselves
    assert same.conditional == pytest.approx(linear_profile("a", 0.6, 0.5).conditional)


def test_a_spread_is_eight_linear_classes_evenly_over_its_range():
    spread = parse_profile("spread")
    firsts = [c.conditional[0] for c in spread.classes]
    assert len(spread.classes) == 8 and firsts == pytest.approx([0.35 + 0.6 * i / 7 for i in range(8)])
    assert [c.conditional[-1] for c in spread.classes] == pytest.approx([a - 0.09 for a in firsts])
    assert all(len(c.conditional) == 15 for c in spread.classes) and len(spread.conditional) == 15
    narrow = parse_profile("spread:0.5-0.6")
    assert narrow.name == "spread:0.5-0.6" and [c.conditional[0] for c in narrow.classes] == pytest.approx(
        [0.5 + 0.1 * i / 7 for i in range(8)]
    )
    low = parse_profile("spread:0-0.05")  # the slope stops at 0
    assert min(min(c.conditional) for c in low.classes) == 0.0


@pytest.mark.parametrize(
    "spec, match",
    [
        ("spread:0.9-0.5", "LO-HI"),
        ("spread:0.5", "LO-HI"),
        ("spread:a-b", "LO-HI"),
        ("spread:0.5-1.5", "LO-HI"),
        ("spreads", "LO-HI"),
        ("code+", "expected one of"),
        ("code+math", "expected one of"),
        ("code+spread", "one class"),
    ],
)
def test_bad_mixed_profiles_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_profile(spec)


@pytest.fixture(scope="module")
def engine():
    target, drafter = known_pair("tiny", torch.device("cpu"), torch.float32, seed=0)
    cfg = EngineConfig(model=target, draft_model=drafter, device="cpu", max_num_seqs=4, max_model_len=96, trace=False)
    return Engine(cfg)


def _run(engine, profile: AcceptanceProfile, tokens: int, seed: int = 0) -> tuple[float, list]:
    modelled = ModelledDrafter(engine, profile, seed=seed).install()
    try:
        before = engine.stats.committed_tokens, engine.stats.rounds
        prompts = random_prompts(4, 6, engine.target_cfg.geometry.vocab_size, seed=seed)
        outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    finally:
        modelled.uninstall()
    committed, rounds = engine.stats.committed_tokens - before[0], engine.stats.rounds - before[1]
    return committed / rounds, echo_failures(prompts, [o.token_ids for o in outs])


def test_every_draft_accepted_or_none_and_the_output_is_the_continuation(engine):
    d = engine.drafts_per_round
    tau, bad = _run(engine, AcceptanceProfile("all", (1.0,) * d), 1 + 4 * (d + 1))
    assert (tau, bad) == (d + 1, [])  # four full rounds per request after the prefill's token
    tau, bad = _run(engine, AcceptanceProfile("none", (0.0,) * d), 9)
    assert (tau, bad) == (1.0, [])


def test_acceptance_follows_the_profile(engine):
    profile = AcceptanceProfile("half", (0.5,) * engine.drafts_per_round)
    tau, bad = _run(engine, profile, 81, seed=4)
    assert bad == []
    assert tau == pytest.approx(expected_committed(profile.conditional, engine.drafts_per_round), abs=0.35)
    assert "draft" not in engine.runner.__dict__  # uninstalled: the class method again


def test_the_wrapper_needs_a_drafter_and_an_even_vocabulary(engine):
    no_drafter = SimpleNamespace(target_cfg=engine.target_cfg, drafter=None)
    with pytest.raises(ValueError, match="no drafter"):
        ModelledDrafter(no_drafter, parse_profile("code"))
    odd = SimpleNamespace(geometry=SimpleNamespace(vocab_size=4095))
    with pytest.raises(ValueError, match="even vocabulary"):
        ModelledDrafter(SimpleNamespace(target_cfg=odd, drafter=engine.drafter), parse_profile("code"))
    with pytest.raises(ValueError, match="rows must be a power of two, not 1000"):
        ModelledDrafter(engine, parse_profile("code"), rows=1000)


def test_arms_share_the_draws_and_a_duplicate_draws_apart(engine):
    # Common random numbers: a run at the same prompts and positions draws the same acceptance (the
    # H200 study's adaptive arm at K = 15 once measured a tau 8 % under spec's from one shared stream).
    profile = AcceptanceProfile("half", (0.5,) * engine.drafts_per_round)
    modelled = ModelledDrafter(engine, profile, seed=1).install()
    prompts = random_prompts(4, 6, engine.target_cfg.geometry.vocab_size, seed=2)
    params = SamplingParams(temperature=0, max_tokens=41, ignore_eos=True)

    def tau() -> float:
        before = engine.stats.committed_tokens, engine.stats.rounds
        engine.generate(prompts, params)
        return (engine.stats.committed_tokens - before[0]) / (engine.stats.rounds - before[1])

    try:
        first, again = tau(), tau()
        modelled.set_replica(1)
        apart = tau()
    finally:
        modelled.uninstall()
    assert first == again and apart != first


def test_the_shared_draws_follow_the_profile_position_by_position(engine):
    cond = (0.9, 0.5, 0.2) + (0.0,) * (engine.drafts_per_round - 3)
    modelled = ModelledDrafter(engine, AcceptanceProfile("steps", cond), seed=0)
    token = torch.arange(2000).repeat_interleave(20) * 7 % engine.target_cfg.geometry.vocab_size
    num_kv = torch.arange(20).repeat(2000) + 6
    n = modelled.accepted(token, num_kv)
    assert torch.equal(n, modelled.accepted(token, num_kv))  # a key always draws the same
    for i, c in enumerate(cond[:3]):  # P(position i+1 accepted | 1..i accepted), over 40,000 keys
        tried = (n >= i).sum().item()
        assert (n > i).sum().item() / tried == pytest.approx(c, abs=4 * (c * (1 - c) / tried) ** 0.5 + 1e-9)
    assert n.max().item() <= 3


def test_several_profiles_draw_by_the_current_token(engine):
    d = engine.drafts_per_round
    profiles = [AcceptanceProfile("all", (1.0,) * d), AcceptanceProfile("none", (0.0,) * d)]
    modelled = ModelledDrafter(engine, profiles, seed=0)
    token = torch.arange(40)
    n = modelled.accepted(token, torch.full((40,), 9))
    assert n[::2].tolist() == [d] * 20 and n[1::2].tolist() == [0] * 20  # class = token % 2
    assert modelled.profile.name == "all" and [p.name for p in parse_profiles("code+weak")] == ["code", "weak"]
    mixed = ModelledDrafter(engine, parse_profile("code+chat"), seed=0)  # a mixed profile: its classes, by token
    assert [p.name for p in mixed.profiles] == ["code", "chat"] and mixed.profile.name == "code+chat"
    mixed.set_profile(AcceptanceProfile("one", (1.0,) * d, tuple(profiles)))
    assert mixed.accepted(token, torch.full((40,), 9)).tolist() == n.tolist()
