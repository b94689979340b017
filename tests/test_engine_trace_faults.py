"""Engine-level tests for the faults of issue 15 that live in the engine, through the public API
(Engine, EngineConfig, SamplingParams, step, the trace on stderr): the trace agrees with the outputs
(capture continuity, budgets, ids), a stop token inside an accepted run ends the request where plain
decode ends it, and the auto-hedge controller books no gated round."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.hedge import AutoHedge
from tests.checkpoints import make_dspark_drafter
from trace_tools import RequestLine, levers_trace_rows, request_problems

BUDGETS = [32, 10, 24, 16]


@pytest.fixture(scope="module")
def pair(shipped_tiny):
    return shipped_tiny


@pytest.fixture(scope="module")
def prompt_ids(shipped_prompt_ids):
    return shipped_prompt_ids[: len(BUDGETS)]


def spec_engine(pair, **levers) -> Engine:
    return Engine(EngineConfig(model=str(pair[0]), draft_model=str(pair[1]), device="cpu", trace=True, levers=levers))


def requests_of(outs, budgets) -> list[RequestLine]:
    return [
        RequestLine(int(o.request_id.split("-")[1]), len(o.prompt_token_ids), len(o.token_ids), b)
        for o, b in zip(outs, budgets, strict=True)
    ]


@pytest.mark.parametrize("levers", [{}, {"max_batch": 3}, {"max_drafts": 2}], ids=["free", "gated", "trim"])
def test_the_trace_agrees_with_the_outputs(pair, prompt_ids, capsys, levers):
    """Per request: prefill + committed tokens = output, accepted <= verified <= span_limit, no
    accept past the budget, and the drafter context = committed tokens but the newest after every
    round (a gated round keeps its capture)."""
    engine = spec_engine(pair, **levers)
    capsys.readouterr()
    outs = engine.generate(prompt_ids, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    assert rows and all(r.draft_ctx is not None and r.span_limit is not None for r in rows)
    assert request_problems(rows, requests_of(outs, BUDGETS), stops=False) == []
    if levers.get("max_batch"):
        assert any(r.gated for r in rows) and any(not r.gated for r in rows)


def _inside_accepted_run(rows, output: list[int]) -> int | None:
    """An output position that a round committed as an accepted draft, not its last token, whose
    token does not occur earlier in the output; None if the trace shows none."""
    produced = 1
    for r in rows:
        for p in range(produced, produced + min(r.accepted_draft, r.committed_tokens - 1)):
            if output[p] not in output[:p]:
                return p
        produced += r.committed_tokens
    return None


def test_a_stop_token_inside_an_accepted_run_ends_the_request_there(pair, prompt_ids, capsys):
    engine = spec_engine(pair)
    plain = Engine(EngineConfig(model=str(pair[0]), device="cpu"))
    found = None
    for ids in prompt_ids:
        capsys.readouterr()
        (free,) = engine.generate([ids], SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
        at = _inside_accepted_run(levers_trace_rows(capsys.readouterr().err.splitlines()), free.token_ids)
        if at is not None:
            found = (ids, free.token_ids, at)
            break
    assert found is not None, "no accepted run on the shipped pair: nothing to place a stop token in"
    ids, output, at = found
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop_token_ids=[output[at]])
    (want,) = plain.generate([ids], params)
    capsys.readouterr()
    (got,) = engine.generate([ids], params)
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    assert want.token_ids == output[: at + 1] and got.token_ids == want.token_ids
    assert got.finish_reason == "stop"
    assert any(r.committed_tokens < r.accepted_draft + 1 for r in rows), "the stop never fell inside an accepted run"
    assert request_problems(rows, requests_of([got], [48]), stops=True) == []


def test_auto_hedge_books_no_gated_round_and_reanchors_after_it(tiny_target, tmp_path, capsys, monkeypatch):
    """With the auto controller on and MAX_BATCH tripping: every gated step breaks the window and ticks
    nothing; the first speculating round after gated ones only re-anchors (a break comes before its
    tick with no tick between)."""
    drafter = tmp_path / "dspark"
    make_dspark_drafter(drafter, layout="deepspec", block_size=5)
    calls: list[str] = []
    for name in ("tick", "break_window", "reanchor"):
        real = getattr(AutoHedge, name)

        def spy(self, *args, _real=real, _name=name):
            calls.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(AutoHedge, name, spy)
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(drafter),
            device="cpu",
            trace=True,
            levers={"hedge": 8, "hedge_positions": (0, 1, 2), "hedge_auto": True, "max_batch": 3},
        )
    )
    for ids, budget in zip([[5, 6, 7, 8], [1, 2, 3], list(range(20, 40)), [7] * 9], [30, 6, 20, 14], strict=True):
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))
    capsys.readouterr()
    steps: list[tuple[str, list[str]]] = []
    while engine.has_unfinished():
        calls.clear()
        engine.step()
        rows = levers_trace_rows(capsys.readouterr().err.splitlines())
        kind = "prefill" if not rows else ("gated" if all(r.gated for r in rows) else "spec")
        steps.append((kind, list(calls)))
    gated = [c for k, c in steps if k == "gated"]
    assert gated and all(c == ["break_window"] for c in gated), gated
    resumed = [i for i, (k, _) in enumerate(steps) if k == "spec" and i and steps[i - 1][0] == "gated"]
    assert resumed, "no speculating round followed a gated one"
    assert all(steps[i][1] == ["tick"] for i in resumed)
    assert all(c in (["tick"], ["reanchor"]) for k, c in steps if k != "gated")
