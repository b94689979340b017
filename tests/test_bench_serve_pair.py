"""serve-load's known-pair server (engine/bench/serve_pair.py) at the tiny geometry on CPU: token-id
prompts, streaming, the known continuation through the modelled drafter, refused flags; and serve-load
against it end to end (real server processes, a second of load)."""

from __future__ import annotations

import csv

import pytest

for _name in ("uvicorn", "starlette", "openai", "httpx"):  # the serve and dev extras
    pytest.importorskip(_name, reason=f"{_name} is not installed (pip install -e '.[serve,dev]')")

import httpx  # noqa: E402
import openai  # noqa: E402
import torch  # noqa: E402

from engine.bench import serve_load, serve_pair  # noqa: E402
from engine.bench.arms import parse_arm  # noqa: E402
from engine.bench.serve_workload import pair_command  # noqa: E402
from engine.fixture.known.geometry import random_prompts  # noqa: E402
from engine.fixture.known.modelled import parse_profile  # noqa: E402
from engine.fixture.known.target import continuation  # noqa: E402
from tests.serve_helpers import serving  # noqa: E402

NAME = "known-tiny"
ARM = "spec+trim=4"


@pytest.fixture(scope="module")
def server(one_thread):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PEGAINFER_SPEC_MAX_BATCH", "1")  # would gate every round, if it leaked into the arm
        engine = serve_pair.known_engine("tiny", parse_profile("code"), parse_arm(ARM), torch.device("cpu"))
    with serving(engine, NAME) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_the_arm_sets_every_lever_and_installs_the_modelled_drafter(server):
    engine = server.worker.engine
    assert (engine.levers.max_drafts, engine.levers.max_batch, engine.levers.hedge) == (4, 0, 0)
    assert engine.runner.draft.__self__.profile.name == "code"


def test_token_id_prompts_get_the_known_continuation_whole_and_streamed(client):
    for prompt in random_prompts(3, 12, 4096, seed=4):
        whole = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, temperature=0)
        (choice,) = whole.choices
        assert choice.text == "".join(f" {t}" for t in continuation(prompt, 20))
        assert (choice.finish_reason, whole.usage.completion_tokens) == ("length", 20)
        chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=20, temperature=0, stream=True))
        assert len(chunks) > 1 and all(c.choices[0].text for c in chunks)
        assert "".join(c.choices[0].text for c in chunks) == choice.text


def test_the_streamed_text_reads_back_as_ids_and_rounds_commit_several_tokens(server, client):
    whole = client.completions.create(model=NAME, prompt=" 7 300 41", max_tokens=12, temperature=0)
    assert [int(w) for w in whole.choices[0].text.split()] == [41] * 12
    assert server.worker.engine.stats.committed_tokens > server.worker.engine.stats.rounds  # τ > 1


def test_what_the_pair_cannot_serve_is_refused_with_a_message(server, client):
    with pytest.raises(openai.BadRequestError, match="no vocabulary and no chat template"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    reply = httpx.post(server.base_url + "/completions", json={"prompt": "def main", "max_tokens": 2}, timeout=60)
    assert reply.status_code == 400 and "send token ids" in reply.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model=NAME, prompt=[4096], max_tokens=2)
    assert httpx.get(server.url + "/health").text == "ok"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--profile", "prose"], "acceptance profile 'prose'"),
        (["--geometry", "7b"], "invalid choice: '7b'"),
        (["--arm", "spec+trim=0"], "trim=0; must be >= 1"),
        (["--arm", "fast"], "unknown arm 'fast'"),
        (["--port", "70000"], "--port must be in 0..65535"),
    ],
)
def test_serve_pair_refuses_bad_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_pair.main(flags)
    assert message in (str(exit_info.value.code) + capsys.readouterr().err)


def test_pair_commands_parse_as_serve_pair_flags():
    pair = pair_command(parse_arm("spec+gate=32"), "4b", "chat")
    parsed = serve_pair._parser().parse_args(pair[4:])
    assert (parsed.geometry, parsed.profile.name, parsed.arm.gate) == ("4b", "chat", 32)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--geometry", "tiny", "--target", "t"], "leave out --target"),
        (["--geometry", "tiny", "--profile", "prose"], "--profile: acceptance profile 'prose'"),
        (["--geometry", "tiny", "--prompt-len", "0"], "--prompt-len and --num-prompts must be >= 1"),
    ],
)
def test_serve_load_refuses_a_bad_known_pair_before_starting_servers(flags, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        serve_load.main([*flags, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_serve_load_against_the_known_pair_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two tiny servers on a small shared CPU
    out = tmp_path / "out"
    flags = ["--geometry", "tiny", "--arms", "spec", "--rates", "20", "--duration-s", "0.1", "--repeats", "1"]
    flags += ["--min-requests", "3", "--warmup-requests", "1", "--max-tokens", "6", "--max-num-seqs", "4"]
    serve_load.main([*flags, "--num-prompts", "3", "--prompt-len", "5", "--device", "cpu", "--out", str(out)])
    with (out / "serve_load.csv").open() as f:
        rows = {r["arm"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["plain", "spec"]
    for row in rows.values():
        assert (row["requests"], row["errors"], row["output_tokens"]) == ("3", "0", "18")
    assert rows["plain"]["tau"] == "" and float(rows["spec"]["tau"]) > 1
    report = (out / "serve_load.md").read_text()
    assert "Bench-only pair: known-tiny" in report and "Modelled: where the first wrong draft falls" in report
