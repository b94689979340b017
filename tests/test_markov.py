"""The DSpark Markov head: the batched walk (and its hedge chains) against the one-request
reference, both drafter layouts loading and drafting through the engine token for token like the
plain-torch reference loop, and the layout never keyed on the Markov head."""

from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.dflash_model import MarkovHead, markov_chain_ref, markov_walk_ref
from engine.loader import CheckpointError
from engine.models.config import DEEPSPEC, ZLAB, DFlashConfig
from engine.models.markov import markov_walk
from engine.shipped import shipped_pair
from tests.checkpoints import make_dspark_drafter
from tests.drafts import engine_drafts, reference_drafts

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
DSPARK = shipped_pair("tiny")[1].parent / "drafter-dspark"


@pytest.fixture(scope="module")
def deepspec_drafter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deepspec")
    make_dspark_drafter(directory, layout="deepspec")
    return directory


@pytest.fixture(scope="module")
def zlab_markov_drafter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("zlab-markov")
    make_dspark_drafter(directory, layout="zlab", block_size=6)
    return directory


@pytest.mark.parametrize("positions", [(), (0,), (0, 1, 2), (1, 3)])
def test_batched_walk_and_chains_equal_the_reference(positions):
    torch.manual_seed(0)
    n, d, v, r = 5, 4, 50, 8
    head = MarkovHead(v, r)
    with torch.no_grad():
        head.markov_w2.weight.normal_(0.0, 2.0)
    logits = torch.randn(n, d, v)
    anchors = torch.randint(0, v, (n,))
    drafts, chains = markov_walk(logits, anchors, head.markov_w1.weight, head.markov_w2.weight, positions)
    for i in range(n):
        assert drafts[i].tolist() == markov_walk_ref(logits[i], int(anchors[i]), head)
        for j, p in enumerate(positions):
            chain = chains[i, j].tolist()
            assert chain == markov_chain_ref(logits[i], int(anchors[i]), head, p)
            assert chain[:p] == drafts[i, :p].tolist() and chain[p] != drafts[i, p]
    assert chains is None if not positions else chains.shape == (n, len(positions), d)
    # The bias matters here: the walk is not the plain per-row argmax.
    assert not torch.equal(drafts, logits.argmax(-1))


def test_layout_is_the_checkpoints_not_the_markov_heads(deepspec_drafter, zlab_markov_drafter):
    ds = DFlashConfig.from_dict(json.loads((deepspec_drafter / "config.json").read_text()))
    zl = DFlashConfig.from_dict(json.loads((zlab_markov_drafter / "config.json").read_text()))
    assert (ds.layout, ds.anchor_first, ds.markov_rank, ds.drafts_per_round) == (DEEPSPEC, True, 16, 5)
    # Upstream keyed anchor-first on markov_rank once and acceptance collapsed.
    assert (zl.layout, zl.anchor_first, zl.markov_rank, zl.drafts_per_round) == (ZLAB, False, 16, 5)


def test_markov_config_and_tensor_errors(tmp_path, tiny_target, deepspec_drafter):
    d = json.loads((deepspec_drafter / "config.json").read_text())
    with pytest.raises(CheckpointError, match="markov_head_type"):
        DFlashConfig.from_dict({**d, "markov_head_type": "rnn"})
    with pytest.raises(CheckpointError, match="markov_rank"):
        DFlashConfig.from_dict({**d, "markov_rank": -1})
    # Markov tensors in a checkpoint whose config says rank 0: refused, not silently dropped.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**d, "markov_rank": 0}))
    (bad / "model.safetensors").symlink_to(deepspec_drafter / "model.safetensors")
    with pytest.raises(CheckpointError, match="markov_rank is 0"):
        Engine(EngineConfig(model=str(tiny_target), draft_model=str(bad), device="cpu"))


@pytest.mark.parametrize("layout", ["deepspec", "zlab"])
def test_engine_drafts_the_markov_walk_like_the_reference(tiny_target, deepspec_drafter, zlab_markov_drafter, layout):
    drafter = deepspec_drafter if layout == "deepspec" else zlab_markov_drafter
    engine, outs, drafts = engine_drafts(tiny_target, drafter, PROMPTS, [24] * len(PROMPTS))
    ref_tokens, ref_drafts = reference_drafts(tiny_target, drafter, PROMPTS, [24] * len(PROMPTS))
    assert [o.token_ids for o in outs] == ref_tokens
    assert drafts == ref_drafts
    assert engine.drafts_per_round == 5  # block 5 anchor-first, block 6 anchor-drop
    assert engine.drafter.markov is not None and sum(map(len, drafts)) > 20


def test_engine_batches_the_walk_across_requests(tiny_target, deepspec_drafter):
    """Concurrent requests draft in one batched walk; outputs equal plain greedy."""
    plain = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    spec = Engine(EngineConfig(model=str(tiny_target), draft_model=str(deepspec_drafter), device="cpu"))
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in (30, 9, 21, 14)]
    want = [o.token_ids for o in plain.generate(PROMPTS, params)]
    assert [o.token_ids for o in spec.generate(PROMPTS, params)] == want
    assert spec.stats.rounds > 0


@pytest.mark.skipif(not (DSPARK / "config.json").is_file(), reason="the fixture's drafter-dspark is not built")
def test_fixture_dspark_drafter_drafts_like_the_reference():
    target, _ = shipped_pair("tiny")
    cfg = DFlashConfig.from_dict(json.loads((DSPARK / "config.json").read_text()))
    assert cfg.layout == ZLAB and not cfg.anchor_first and cfg.markov_rank > 0
    engine = Engine(EngineConfig(model=str(target), device="cpu"))
    prompts = [engine.tokenizer.encode(t, add_special_tokens=False) for t in ("def main():\n    ", "import os\n")]
    _, outs, drafts = engine_drafts(target, DSPARK, prompts, [32] * len(prompts))
    ref_tokens, ref_drafts = reference_drafts(target, DSPARK, prompts, [32] * len(prompts))
    assert [o.token_ids for o in outs] == ref_tokens
    assert drafts == ref_drafts
