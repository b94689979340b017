"""The fixture's Markov-head build: block data aligned for the walk, and the CLI end to end on the
shipped pair with a toy-sized recipe (seconds)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3ForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.__main__ import main
from engine.fixture.dflash_model import DFlashDraftModel
from engine.fixture.train_markov import backbone_blocks, backbone_logits, block_acceptance
from engine.models.config import DFlashConfig
from engine.shipped import DATA_DIR, shipped_pair

TOY = [
    "files=3",
    "sequences=12",
    "new_tokens=24",
    "anchors=3",
    "steps=4",
    "batch=8",
    "eval_every=2",
    "eval_prompts=2",
    "eval_tokens=8",
]


@pytest.fixture(scope="module")
def pair():
    target_dir, drafter_dir = shipped_pair("tiny")
    target = Qwen3ForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    return target, DFlashDraftModel.from_pretrained(drafter_dir).eval()


def test_blocks_are_aligned_for_the_walk(pair):
    target, drafter = pair
    gen = torch.Generator().manual_seed(0)
    seqs = torch.randint(5, 4000, (3, 40), generator=gen)
    hidden, prev, labels = backbone_blocks(target, drafter, seqs, 10, 4, gen)
    d = drafter.cfg.drafts_per_round
    assert hidden.shape == (12, d, drafter.cfg.geometry.hidden_size) and prev.shape == labels.shape == (12, d)
    assert torch.equal(prev[:, 1:], labels[:, :-1])  # row k's previous token is row k-1's label
    for row_prev, row_labels in zip(prev.tolist(), labels.tolist(), strict=True):
        text = [*row_prev, row_labels[-1]]  # anchor .. anchor + d: a window of one sequence
        assert any(text == s[i : i + d + 1] for s in seqs.tolist() for i in range(len(s) - d))
    base = backbone_logits(hidden, target.get_output_embeddings().weight.detach())
    tau = block_acceptance(base, prev, labels, None)
    assert 1.0 <= tau["tau"] <= 1 + d and len(tau["acc"]) == d


def test_markov_cli_builds_a_loadable_drafter(tmp_path, capsys):
    out = tmp_path / "dspark"
    args = ["markov", "--pair", str(DATA_DIR / "tiny"), "--out", str(out), "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        assert main(args + [a for item in TOY for a in ("--set", item)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = json.loads(capsys.readouterr().out)
    assert printed["engine_heldout"]["prompts"] == 2
    cfg = DFlashConfig.from_dict(json.loads((out / "config.json").read_text()))
    assert cfg.markov_rank == 32 and not cfg.anchor_first and cfg.block_size == 8
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["steps"] == 4 and manifest["train"]["best_step"] in (0, 2, 4)
    engine = Engine(EngineConfig(model=str(shipped_pair("tiny")[0]), draft_model=str(out), device="cpu"))
    assert engine.drafter.markov is not None
    engine.generate(["def f(x):\n"], SamplingParams(temperature=0, max_tokens=8))
    with pytest.raises(SystemExit, match="unknown MarkovRecipe field"):
        main(["markov", "--out", str(tmp_path / "x"), "--set", "bogus=1"])
