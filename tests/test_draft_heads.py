"""The drafter's LM head over the verified positions only (SPEC 10): a round verifying K drafts computes
the logits (and the Markov walk) of the first K draft positions, and those drafts are bit-identical to
the first K of the full head's, for the plain DFlash head and the DSpark Markov head; a round's trace
and tokens are unchanged by it."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import make_drafter, make_dspark_drafter

PROMPTS = [[5, 9, 2, 7, 7, 1, 3], [4, 4, 8, 1], [2, 6, 1, 9, 3, 3, 8, 5, 1, 2]]


@pytest.fixture(scope="module", params=["dflash", "dspark"])
def drafter(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "dflash":
        make_drafter(directory, block_size=9)
    else:
        make_dspark_drafter(directory, layout="deepspec", block_size=9)
    return directory


def staged_engine(target, drafter) -> tuple[Engine, list]:
    engine = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu"))
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0))
    engine.step()  # the prefill: every request draft-ready
    reqs = list(engine.scheduler.running)
    engine.runner.stage(reqs)
    return engine, reqs


def test_the_head_over_k_positions_drafts_the_full_heads_first_k(tiny_target, drafter, one_thread):
    engine, reqs = staged_engine(tiny_target, drafter)
    runner, per_round = engine.runner, engine.drafts_per_round
    full = runner.draft(reqs)
    assert full.shape == (len(reqs), per_round)
    for k in sorted({1, 2, 4, 8, per_round}):
        runner.stage(reqs)
        heads = runner.draft(reqs, k)
        assert heads.shape == (len(reqs), k) and heads.tolist() == full[:, :k].tolist(), k
    for bad in (0, per_round + 1):
        with pytest.raises(ValueError, match="draft heads"):
            runner.draft(reqs, bad)


@pytest.mark.parametrize("levers", [{}, {"max_drafts": 2}, {"max_drafts": 4}], ids=["all", "trim2", "trim4"])
def test_rounds_draft_only_the_positions_they_verify(tiny_target, drafter, one_thread, levers):
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(drafter), device="cpu", levers=levers))
    widths, real = [], engine.runner.draft

    def record(reqs, heads=None):
        out = real(reqs, heads)
        widths.append(out.shape[1])
        return out

    engine.runner.draft = record
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0))
    plain = Engine(EngineConfig(model=str(tiny_target), device="cpu")).generate(
        PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0)
    )
    k = levers.get("max_drafts") or engine.drafts_per_round
    assert widths and set(widths) == {k}
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (triton backend, CUDA graphs)")
@pytest.mark.parametrize(("dtype", "invariant"), [("float32", False), ("bfloat16", True), ("bfloat16", False)])
def test_graphed_heads_on_the_gpu(tiny_target, drafter, dtype, invariant):
    """The graphed drafter with the head over K positions, replay against replay (a graph's first call
    also captures it): bit-identical to the full head's first K in fp32 and under batch_invariant; in
    default bf16 the LM head's GEMM may tile K rows otherwise, so near-ties can flip: at most 1 % of the
    drafts differ. A Markov-head drafter under graphs keeps the full head (engine/runner.py)."""
    engine = Engine(
        EngineConfig(
            model=str(tiny_target), draft_model=str(drafter), device="cuda", dtype=dtype, batch_invariant=invariant
        )
    )
    for p in PROMPTS * 3:
        engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0))
    engine.step()
    reqs, runner = list(engine.scheduler.running), engine.runner

    def replayed(k=None):
        for _ in range(2):
            runner.stage(reqs)
            drafts = runner.draft(reqs, k)
        return drafts.clone()

    full = replayed()
    differ = total = 0
    for k in sorted({1, 2, 4, 8, engine.drafts_per_round}):
        heads = replayed(k)
        differ += int((heads != full[:, :k]).sum())
        total += heads.numel()
    if dtype == "float32" or invariant:
        assert differ == 0
    else:
        assert differ <= 0.01 * total, f"{differ} of {total} drafts differ"
