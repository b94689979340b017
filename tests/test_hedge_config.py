"""Hedge configuration: what the levers turn on, what scratch KV they reserve at start, and what is
said (once) when a lever has no effect."""

from __future__ import annotations

import logging

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import make_dspark_drafter

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
BUDGETS = [40, 7, 25, 33]


@pytest.fixture(scope="module")
def dspark(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dspark-config")
    make_dspark_drafter(directory, layout="deepspec", block_size=5)
    return directory


@pytest.fixture(scope="module")
def want(tiny_target):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    return [
        o.token_ids
        for o in engine.generate(
            PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
        )
    ]


def test_hedge_without_a_markov_head_says_so_once_and_does_nothing(tiny_target, tiny_drafter, want, caplog):
    with caplog.at_level(logging.INFO, logger="engine.hedge.hedger"):
        engine = Engine(
            EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", levers={"hedge": 4})
        )
        engine.set_levers(hedge=8)
    said = [r.getMessage() for r in caplog.records if "no Markov head" in r.getMessage()]
    assert len(said) == 1 and "hedge=4" in said[0]
    assert engine.rounds.hedger.scratch is None and engine.rounds.hedger.on is None
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    assert [o.token_ids for o in outs] == want
    assert engine.stats.hedge_chains == 0


def test_scratch_is_reserved_from_the_kv_budget(tiny_target, dspark):
    # block 5 anchor-first: span 6 rows reach 2 blocks of 16 from any offset; 2 requests x 3 positions.
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(dspark),
            device="cpu",
            max_num_seqs=4,
            num_kv_blocks=40,
            levers={"hedge": 2, "hedge_positions": (0, 1, 2, 7)},
        )
    )
    assert engine.rounds.hedger.scratch.chains == 6 and engine.rounds.hedger.scratch.per_chain == 2
    assert engine.blocks.num_blocks == 40 - 12 and engine.runner.kv[0][0].shape[0] == 40
    assert engine.runner.block_tables.shape[0] == 4 + 1 + 6
    with pytest.raises(ValueError, match="leaves no KV pool"):
        Engine(
            EngineConfig(
                model=str(tiny_target),
                draft_model=str(dspark),
                device="cpu",
                num_kv_blocks=12,
                levers={"hedge": 2, "hedge_positions": (0, 1, 2)},
            )
        )
    off = Engine(EngineConfig(model=str(tiny_target), draft_model=str(dspark), device="cpu", num_kv_blocks=40))
    assert off.rounds.hedger.scratch is None and off.blocks.num_blocks == 40


def test_set_levers_turns_the_hedge_and_its_controller_on_and_off(tiny_target, dspark, want, caplog, capsys):
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    with caplog.at_level(logging.INFO, logger="engine.hedge.hedger"):
        cold = Engine(EngineConfig(model=str(tiny_target), draft_model=str(dspark), device="cpu"))
        cold.set_levers(hedge=8)  # no scratch was reserved at start
        hot = Engine(
            EngineConfig(
                model=str(tiny_target),
                draft_model=str(dspark),
                device="cpu",
                trace=True,
                levers={"hedge": 2, "hedge_positions": (0, 9)},
            )
        )
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "no scratch KV was reserved" in said and "hedge positions [9] dropped" in said
    assert cold.rounds.hedger.on is None
    assert [o.token_ids for o in cold.generate(PROMPTS, params)] == want and cold.stats.hedge_chains == 0
    assert hot.rounds.hedger.on.positions == (0,) and hot.rounds.hedger.scratch.chains == 2
    hot.set_levers(hedge_auto=True)
    assert hot.rounds.hedger.on.auto is not None and hot.rounds.hedger.on.auto.max_chains == 1
    assert [o.token_ids for o in hot.generate(PROMPTS, params)] == want
    hot.set_levers(hedge=0)
    chains = hot.stats.hedge_chains
    assert [o.token_ids for o in hot.generate(PROMPTS, params)] == want and hot.stats.hedge_chains == chains
    capsys.readouterr()
