"""A bounded soak: a few hundred short requests streamed into a speculating engine with the levers on
and a KV pool that forces preemption; random prompts, budgets and sampling, and ~10 % malformed.
Every request is answered exactly once, malformed ones are rejected with a reason, greedy outputs
equal plain decode, and nothing leaks."""

from __future__ import annotations

import random

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import VOCAB
from tests.engine_checks import assert_idle

N = 240
MAX_LEN = 48  # max_model_len; the drafter's block of 6 leaves a context limit of 42
LIMIT = MAX_LEN - 6


def _malformed(rng: random.Random) -> tuple[list[int], SamplingParams, str]:
    """A request the engine must refuse, and a word its reason must contain."""
    kind = rng.randrange(5)
    ok = SamplingParams(temperature=0, max_tokens=4)
    if kind == 0:
        return [1, 2, VOCAB + rng.randrange(1000)], ok, "vocabulary"
    if kind == 1:
        return [3, -1 - rng.randrange(5), 4], ok, "vocabulary"
    if kind == 2:
        return [], ok, "empty"
    if kind == 3:
        return [5] * (LIMIT + rng.randrange(10)), ok, "longer"
    return [6] * 10, SamplingParams(temperature=0, max_tokens=LIMIT - 9 + rng.randrange(20)), "exceeds"


def _workload(seed: int = 0) -> list[tuple[list[int], SamplingParams, str | None]]:
    rng = random.Random(seed)
    work = []
    for i in range(N):
        if rng.random() < 0.1:
            work.append(_malformed(rng))
            continue
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 16))]
        budget = rng.randint(1, 16)
        if rng.random() < 0.3:
            params = SamplingParams(
                max_tokens=budget, temperature=rng.uniform(0.5, 1.2), top_k=rng.choice([0, 20]), seed=i
            )
        else:
            params = SamplingParams(temperature=0, max_tokens=budget, ignore_eos=rng.random() < 0.5)
        work.append((prompt, params, None))
    return work


def test_soak(tiny_target, tiny_drafter, one_thread):
    cfg = EngineConfig(
        model=str(tiny_target),
        draft_model=str(tiny_drafter),
        device="cpu",
        max_model_len=MAX_LEN,
        max_num_seqs=12,
        kv_block_size=4,
        num_kv_blocks=40,  # 39 usable: about four full-length requests, so the batch preempts
        levers={"max_batch": 8, "max_drafts": 4},
    )
    engine = Engine(cfg)
    work, rng = _workload(), random.Random(1)
    ids: list[str] = []
    finals = {}
    while len(ids) < len(work) or engine.has_unfinished():
        for _ in range(rng.randint(0, 6)):  # requests arrive while others run
            if len(ids) < len(work):
                prompt, params, _ = work[len(ids)]
                ids.append(engine.add_request(prompt, params))
        for out in engine.step():
            assert out.request_id not in finals, f"{out.request_id} reported after it finished"
            if out.finished:
                finals[out.request_id] = out

    # Every request answered exactly once; the run preempted, gated and speculated; nothing leaked.
    assert sorted(finals) == sorted(ids) and len(set(ids)) == N
    assert engine.preemptions > 0 and engine.stats.gated_rounds > 0
    assert engine.stats.rounds > engine.stats.gated_rounds
    assert_idle(engine)

    # Malformed requests rejected with a reason; the others ran within their budgets.
    for rid, (_, params, why) in zip(ids, work, strict=True):
        out = finals[rid]
        if why is not None:
            assert out.finish_reason == "rejected" and why in out.error, (rid, out.error)
            continue
        assert out.finish_reason in ("stop", "length") and out.error is None
        assert 1 <= len(out.token_ids) <= params.max_tokens

    # Greedy outputs equal plain decode (a target-only engine, one batch).
    greedy = [(rid, p, sp) for rid, (p, sp, why) in zip(ids, work, strict=True) if why is None and sp.greedy]
    plain = Engine(EngineConfig(model=str(tiny_target), device="cpu", max_model_len=MAX_LEN, max_num_seqs=64))
    ref = plain.generate([p for _, p, _ in greedy], [sp for _, _, sp in greedy])
    assert [finals[rid].token_ids for rid, _, _ in greedy] == [o.token_ids for o in ref]
