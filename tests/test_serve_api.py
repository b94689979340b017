"""The OpenAI-compatible server end to end, through the official `openai` client."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

for _name in ("uvicorn", "starlette", "openai", "httpx"):  # the serve and dev extras
    pytest.importorskip(_name, reason=f"{_name} is not installed (pip install -e '.[serve,dev]')")

import httpx  # noqa: E402
import openai  # noqa: E402

from tests.serve_helpers import MODEL, wait_for  # noqa: E402

PROMPTS = ["def main():\n", "import os\n", "class Config:\n", "# Copyright"]
LONG = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(live):  # tests/conftest.py: the shipped tiny pair served for this module
    return live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf"^pegaspec_{name} (\S+)$", text, re.MULTILINE)
    assert match, f"pegaspec_{name} missing from /metrics"
    return float(match.group(1))


def test_health_and_models(server, client):
    assert httpx.get(server.url + "/health").text == "ok"
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_streamed_equals_whole(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0, extra_body=LONG)
    (choice,) = whole.choices
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 24
    assert whole.usage.prompt_tokens > 0 and choice.text
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0, stream=True, extra_body=LONG
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_chat_streamed_equals_whole(client):
    messages = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "def main():"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    (choice,) = whole.choices
    assert choice.message.role == "assistant" and whole.object == "chat.completion"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n_choices_are_seeded_and_distinct(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=1.0, seed=11, n=3, extra_body=LONG)
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]
    assert len(set(texts)) > 1
    streamed = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert list(streamed.values()) == texts


def test_concurrent_clients_get_their_own_outputs(client):
    def ask(prompt: str) -> str:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body=LONG)
        return out.choices[0].text

    alone = [ask(p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(ask, PROMPTS))
    assert together == alone


def test_stop_strings_trim_the_text_streamed_or_not(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=40, temperature=0, extra_body=LONG)
    free = client.completions.create(**kwargs).choices[0].text
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    (whole,) = client.completions.create(stop=[stop, "@@never@@"], **kwargs).choices
    assert whole.finish_reason == "stop" and whole.text == free[: free.find(stop)]
    chunks = list(client.completions.create(stop=[stop, "@@never@@"], stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_for_completions_and_chat(client):
    out = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=6, temperature=0, logprobs=2, extra_body=LONG
    )
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 6
    assert all(v <= 0 for v in lp.token_logprobs) and all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)


def test_disconnect_mid_stream_aborts_and_frees_kv(server, client):
    aborted = metric(server, "aborted_total")
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=1500, temperature=0, stream=True, extra_body=LONG
    )
    for n, _ in enumerate(stream):
        if n == 2:
            break
    stream.close()
    wait_for(lambda: metric(server, "aborted_total") == aborted + 1, "the request to be aborted")
    wait_for(lambda: metric(server, "running") == 0, "the request to leave the batch")
    assert metric(server, "kv_blocks_free") == metric(server, "kv_blocks_total")


def test_malformed_requests_get_400_and_the_server_keeps_serving(server, client):
    bad = httpx.post(
        server.base_url + "/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"temperature": "hot"})
    with pytest.raises(openai.BadRequestError, match="exceeds"):  # admission refuses a too-long request
        client.completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].finish_reason


def test_metrics_show_speculation(server, client):
    client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=16, temperature=0, extra_body=LONG)
    assert metric(server, "requests_total") >= 1 and metric(server, "completion_tokens_total") >= 16
    assert metric(server, "rounds_total") > 0 and metric(server, "tau") > 1
    for name in ("gated_rounds_total", "preemptions_total", "hedge_chains_total", "lever_max_batch"):
        assert metric(server, name) >= 0
    assert metric(server, "launched_ahead_total") >= metric(server, "launched_ahead_used_total") > 0
