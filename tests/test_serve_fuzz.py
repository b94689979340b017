"""A property of the HTTP boundary: random bytes, random JSON and random requests (lone surrogates
included) each get a 2xx or a 4xx with a message, never a 500, and the server then serves normally.
Bounded (a fixed number of derandomized examples, no deadline) so it is fast and load-independent."""

from __future__ import annotations

import json

import pytest

for _name in ("uvicorn", "starlette", "httpx", "hypothesis"):  # the serve and dev extras
    pytest.importorskip(_name, reason=f"{_name} is not installed (pip install -e '.[serve,dev]')")

import hypothesis  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.serve_helpers import MODEL, wait_for  # noqa: E402

ENDPOINTS = ("/completions", "/chat/completions")


ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates included
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=10,
)
TEXT = st.text(st.characters(exclude_categories=()), min_size=1, max_size=12)
TOKEN_IDS = st.lists(st.integers(0, 4200), min_size=1, max_size=8)  # the tiny vocabulary is 4096
# Well-typed values near the edges reach the engine; JSON of any shape exercises each field's check.
TYPED = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, 6),
    "temperature": st.sampled_from([0, 0.5, 1.0, 2.0]) | st.floats(0, 3),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 50),
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**63 - 1),
    "stop": TEXT | st.lists(TEXT, max_size=4),
    "stop_token_ids": st.lists(st.integers(0, 4200), max_size=3),
    "stream": st.booleans(),
    "logprobs": st.integers(0, 3),
    "min_tokens": st.integers(0, 3),
    "ignore_eos": st.booleans(),
}
JUNK = {name: JSON for name in [*TYPED, "stream_options", "best_of", "top_logprobs", "presence_penalty", "tools"]}
JUNK.pop("model")  # checked first: junk there would hide every other field's check
PROMPT = TEXT | TOKEN_IDS | st.lists(TEXT | TOKEN_IDS, min_size=1, max_size=3)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=20) | TEXT}
)
CHAT_TYPED = {**TYPED, "logprobs": st.booleans()}


def _bodies(typed: st.SearchStrategy, junk: dict) -> st.SearchStrategy:
    """Well-typed bodies, the same with one field of any JSON shape, and bodies of junk only."""
    one_bad = st.tuples(typed, st.sampled_from(sorted(junk)), JSON).map(lambda t: {**t[0], t[1]: t[2]})
    return typed | one_bad | st.fixed_dictionaries({}, optional=junk)


COMPLETION = _bodies(st.fixed_dictionaries({"prompt": PROMPT}, optional=TYPED), {**JUNK, "prompt": JSON})
CHAT = _bodies(
    st.fixed_dictionaries({"messages": st.lists(MESSAGE, min_size=1, max_size=3)}, optional=CHAT_TYPED),
    {**JUNK, "messages": st.lists(MESSAGE | JSON, max_size=3) | JSON},
)


def _answered(http, path: str, raw: bytes) -> None:
    with http.stream("POST", path, content=raw, headers={"content-type": "application/json"}) as response:
        body = response.read()  # a stream is read to its end
    assert response.status_code < 500, (raw[:300], response.status_code, body[:300])
    if response.status_code >= 400:
        assert json.loads(body)["error"]["message"]


def _dumps(body: object) -> bytes:
    return json.dumps(body, ensure_ascii=True).encode()  # lone surrogates become \\ud800 escapes


PROPERTY = hypothesis.settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples every run: no flake, nothing kept between runs
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],  # generation speed depends on the machine
)


@PROPERTY
@hypothesis.given(path=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=200))
def test_random_bytes_are_answered(http, path, raw):
    _answered(http, path, raw)


@PROPERTY
@hypothesis.given(path=st.sampled_from(ENDPOINTS), body=JSON)
def test_random_json_is_answered(http, path, body):
    _answered(http, path, _dumps(body))


@PROPERTY
@hypothesis.given(body=COMPLETION)
def test_random_completion_requests_are_answered(http, body):
    _answered(http, "/completions", _dumps(body))


@PROPERTY
@hypothesis.given(body=CHAT)
def test_random_chat_requests_are_answered(http, body):
    _answered(http, "/chat/completions", _dumps(body))


def test_the_server_serves_normally_after_the_property_tests(live, http):
    # module order: this runs after the property tests above, on the same server
    response = http.post("/completions", json={"prompt": "def main():", "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200 and response.json()["choices"][0]["text"]
    chat = http.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert http.get(live.url + "/health").text == "ok"

    def idle() -> bool:  # the snapshot follows the step that delivered the last output
        snap = live.worker.snapshot
        return snap["running"] == snap["waiting"] == 0 and snap["kv_blocks_free"] == snap["kv_blocks_total"]

    wait_for(idle, "every request to finish and every KV block to be free")
