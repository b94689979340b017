"""Hostile input at the HTTP boundary: every body gets a 2xx or a 4xx with a message (never a 500),
nothing sent is silently ignored, and the server serves normally afterwards."""

from __future__ import annotations

import json
import shutil

import pytest

for _name in ("uvicorn", "starlette", "httpx"):  # the serve and dev extras
    pytest.importorskip(_name, reason=f"{_name} is not installed (pip install -e '.[serve,dev]')")

import httpx  # noqa: E402

from engine import Engine, EngineConfig  # noqa: E402
from engine.serve.body import MAX_DEPTH, decode_body, json_depth  # noqa: E402
from engine.serve.errors import BadRequest  # noqa: E402
from engine.serve.fields import ACCEPTED, NOT_IMPLEMENTED, check_fields  # noqa: E402
from tests.serve_helpers import serving  # noqa: E402

ENDPOINTS = ("/completions", "/chat/completions")
USER = [{"role": "user", "content": "def main():"}]


def _post(http, path: str, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=content, headers={"content-type": "application/json"})


def _refused(response: httpx.Response, *fragments: str, param: str | None = None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert all(f in error["message"] for f in fragments), error
    if param is not None:
        assert error["param"] == param


# -- the body ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "depth"),
    [("{}", 1), ('{"a": [[1], {"b": []}]}', 4), ('"[[[{"', 0), (r'["\"[[", [[]]]', 3), (r'"\\"', 0), ("1", 0)],
)
def test_json_depth_skips_brackets_inside_strings(text, depth):
    assert json_depth(text, 10) == depth


def test_json_depth_stops_counting_past_the_limit():
    assert json_depth("[" * 100_000, MAX_DEPTH) == MAX_DEPTH + 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"prompt": "\xff"}', "not valid UTF-8: byte 0xff at offset 12"),
        (b"\xc3(", "not valid UTF-8: byte 0xc3 at offset 0"),
        (b"[" * 100_000 + b"]" * 100_000, f"deeper than {MAX_DEPTH} levels"),
        (b'{"a": ' * 40 + b"1" + b"}" * 40, f"deeper than {MAX_DEPTH} levels"),
        (b'{"temperature": NaN}', "NaN is not a JSON number"),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "not valid JSON"),
    ],
)
def test_bodies_that_are_not_a_json_object_are_refused(raw, message):
    with pytest.raises(BadRequest, match=message):
        decode_body(raw)


def test_a_body_at_the_depth_limit_is_read():
    nested = "1"
    for _ in range(MAX_DEPTH):
        nested = f"[{nested}]"
    assert decode_body(f'{{"x": {nested[1:-1]}}}'.encode())["x"]  # the object itself is one level


# -- the fields --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("response_format", {"type": "json_object"}),
        ("functions", [{"name": "f"}]),
        ("logit_bias", {"5": 100}),
        ("function_call", "auto"),
        ("echo", True),
        ("guided_json", {"type": "object"}),
    ],
)
@pytest.mark.parametrize("path", ENDPOINTS)
def test_unimplemented_fields_are_refused_by_name(http, path, field, value):
    body = {"prompt": "x"} if path == "/completions" else {"messages": USER}
    _refused(_post(http, path, body | {field: value}), f"'{field}' is not implemented", param=field)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_unknown_fields_are_refused_by_name(http, path):
    body = {"prompt": "x"} if path == "/completions" else {"messages": USER}
    _refused(_post(http, path, body | {"temprature": 0}), "unknown field 'temprature'", param="temprature")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_no_op_values_of_unimplemented_fields_are_served(http, path):
    body = {"prompt": "x"} if path == "/completions" else {"messages": USER}
    quiet = {"logit_bias": None, "tools": [], "tool_choice": "none", "echo": False, "user": "u-1"}
    response = _post(http, path, body | quiet | {"max_tokens": 2})
    assert response.status_code == 200, response.text


def test_every_field_is_either_taken_or_named_unimplemented():
    for endpoint, accepted in ACCEPTED.items():
        assert not accepted & set(NOT_IMPLEMENTED), endpoint
        check_fields(dict.fromkeys(accepted), endpoint)  # None everywhere: nothing refused
    with pytest.raises(BadRequest, match="'messages'"):
        check_fields({"messages": []}, "completions")


# -- text ----------------------------------------------------------------------------------------------
def test_a_lone_surrogate_is_refused_naming_the_prompt_and_position(live, http):
    before = live.worker.counters.requests
    raw = b'{"prompt": ["fine", "ok \\ud800"], "max_tokens": 2}'
    _refused(_post(http, "/completions", raw), "prompt[1] is not valid text: a lone surrogate U+D800 at character 3")
    raw = b'{"messages": [{"role": "user", "content": "\\udfff"}]}'
    _refused(_post(http, "/chat/completions", raw), "messages[0].content is not valid text: a lone surrogate U+DFFF")
    raw = b'{"prompt": "x", "stop": ["\\ud800"]}'
    _refused(_post(http, "/completions", raw), "stop[0] is not valid text")
    assert live.worker.counters.requests == before  # refused before anything reached the engine


def test_chat_is_refused_where_the_tokenizer_has_no_template(shipped_tiny, tmp_path, one_thread):
    target = shutil.copytree(shipped_tiny[0], tmp_path / "target")
    config = json.loads((target / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    engine = Engine(EngineConfig(model=str(target), device="cpu", max_num_seqs=2))
    with pytest.raises(ValueError, match="has no chat template"):
        engine.chat(USER)
    with serving(engine) as live, httpx.Client(base_url=live.base_url, timeout=60) as client:
        _refused(_post(client, "/chat/completions", {"messages": USER}), "has no chat template")
        assert _post(client, "/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_penalties_and_min_p_are_served(http):
    body = {"prompt": "def main():\n", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    penalized = body | {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.3, "min_p": 0.1}
    texts = [_post(http, "/completions", b).json()["choices"][0]["text"] for b in (body, penalized, penalized)]
    assert texts[1] == texts[2] != texts[0]
