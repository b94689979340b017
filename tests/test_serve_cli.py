"""`python -m engine serve` flags and the request parser: bad values refused with a clear message."""

from __future__ import annotations

import gc

import pytest

from engine.__main__ import _parser
from engine.cli_args import engine_config
from engine.knobs import KnobError, read_knobs
from engine.levers import env_name, lever_kind, lever_names
from engine.serve.protocol import BadRequest, parse_chat, parse_completion

BAD_COUNTS = ["-1", "1.5", "", "0x10", "4 ", "4_0", "99999999999999999999999"]
COUNT_LEVERS = [n for n in lever_names() if lever_kind(n) == "count"]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _refused_alike(name: str, raw: str, capsys) -> None:
    with pytest.raises(KnobError) as knob:
        read_knobs({env_name(name): raw})
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["serve", f"{_flag(name)}={raw}"])
    assert exit_.value.code == 2
    assert str(knob.value).replace(env_name(name), _flag(name)) in capsys.readouterr().err


@pytest.mark.parametrize("raw", BAD_COUNTS)
@pytest.mark.parametrize("name", COUNT_LEVERS)
def test_lever_flags_refuse_what_the_env_knob_refuses(name, raw, capsys):
    _refused_alike(name, raw, capsys)


@pytest.mark.parametrize(("name", "raw"), [("hedge_auto", "2"), ("hedge_positions", ""), ("hedge_positions", "0,,1")])
def test_list_and_flag_levers_refuse_like_their_knobs(name, raw, capsys):
    _refused_alike(name, raw, capsys)


def test_lever_flags_reach_the_engine_config():
    args = _parser().parse_args(["serve", "--max-batch", "4", "--hedge-positions", "0,2", "--hedge-auto", "1"])
    config = engine_config(args)
    assert dict(config.levers) == {"max_batch": 4, "hedge_positions": (0, 2), "hedge_auto": True}
    assert (
        config.draft_window == 0
        and engine_config(_parser().parse_args(["serve", "--draft-window", "256"])).draft_window == 256
    )


@pytest.mark.parametrize("raw", ["-1", "2.5", "all"])
def test_a_bad_draft_window_is_refused_naming_the_flag(raw, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--draft-window", raw])
    assert "--draft-window" in capsys.readouterr().err
    # unset flags are left out, so the environment supplies them


@pytest.mark.parametrize("raw", ["65536", "-1", "http"])
def test_bad_port_is_refused(raw, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", f"--port={raw}"])
    assert "--port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": True}, "n"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "seed": -3}, "seed"),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ],
)
def test_bad_completion_fields_are_named(body, field):
    with pytest.raises(BadRequest) as err:
        parse_completion(body)
    assert err.value.param == field and field in str(err.value)


def test_bad_sampling_values_are_refused_with_the_params_message():
    with pytest.raises(BadRequest, match="top_p"):
        parse_completion({"prompt": "x", "top_p": 0})


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
    ],
)
def test_bad_chat_messages_are_refused(body):
    with pytest.raises(BadRequest, match="messages"):
        parse_chat(body, lambda m: "")


def test_completion_fields_map_to_sampling_params():
    parsed = parse_completion(
        {"prompt": ["a", [1, 2]], "max_tokens": 7, "temperature": 0.5, "top_k": -1, "seed": 3, "n": 2, "stream": True}
        | {"stop": "\n", "min_tokens": 2, "logprobs": 0}
    )
    p = parsed.params
    assert parsed.prompts == ["a", [1, 2]] and parsed.n == 2 and parsed.stream
    assert (p.max_tokens, p.temperature, p.top_k, p.seed) == (7, 0.5, -1, 3)  # -1: off, as vLLM
    assert (p.stop, p.min_tokens, p.logprobs) == (("\n",), 2, 0)
    chat = parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3}, str)
    assert chat.params.logprobs == 3


def test_serve_captures_its_graphs_and_freezes_the_start_up_heap_before_it_serves(monkeypatch, tmp_path):
    uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install -e '.[serve]')")
    pytest.importorskip("starlette", reason="starlette is not installed (pip install -e '.[serve]')")
    from engine.serve import cli

    class Worker:
        def __init__(self, engine):
            pass

        start = stop = lambda self: None  # noqa: E731

    frozen, events = [], []

    class Engine:
        def __init__(self, config):
            pass

        def capture_graphs(self):
            events.append("captured")

    monkeypatch.setattr("engine.engine.Engine", Engine)
    monkeypatch.setattr("engine.serve.worker.EngineWorker", Worker)
    monkeypatch.setattr("engine.serve.app.build_app", lambda worker, name: None)
    monkeypatch.setattr(
        uvicorn, "run", lambda app, **kw: (frozen.append(gc.get_freeze_count()), events.append("served"))
    )
    was = gc.get_freeze_count()
    gc.unfreeze()
    try:
        assert cli.run(_parser().parse_args(["serve", "--model", str(tmp_path)])) == 0
    finally:
        gc.unfreeze()
        if was:
            gc.freeze()
    assert frozen and frozen[0] > 0 and events == ["captured", "served"]
