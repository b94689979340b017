"""`pegaspec generate`: help that tells the truth, and a prompt that is not valid text refused."""

from __future__ import annotations

import re

import pytest

from engine.__main__ import main
from engine.console import main as console


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        console(argv)
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_generate_help_shows_its_defaults_under_the_console_name(capsys):
    text = _help(["generate", "--help"], capsys)
    assert text.startswith("usage: pegaspec generate")
    assert "output token budget (default: 64)" in text and "vLLM's default (default: 1.0)" in text
    assert "0 or -1: off (default: 0)" in text and "(default: 1.0: off)" in text
    assert re.search(r"--draft-model DRAFT_MODEL DFlash drafter dir or hub id \(default: none, plain decode;", text)


def test_serve_help_says_plain_decode_is_the_default(capsys):
    text = _help(["serve", "--help"], capsys)
    assert text.startswith("usage: pegaspec serve")
    assert "(default: none, plain decode)" in text and "most requests running (default: 64)" in text


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("ab\udcff", "--prompt is not valid text: an undecodable byte 0xff at character 2"),
        ("\ud800", "--prompt is not valid text: a lone surrogate U+D800 at character 0"),
    ],
)
def test_a_prompt_that_is_not_text_is_refused_before_the_engine_starts(prompt, message, capsys, monkeypatch):
    monkeypatch.setattr("engine.engine.Engine", lambda config: pytest.fail("the engine must not start"))
    assert main(["generate", "--prompt", prompt]) == 2
    assert message in capsys.readouterr().err


def test_python_m_engine_keeps_its_own_name(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m engine generate")


def test_generate_streams_text_past_a_character_split_over_tokens(capsys, monkeypatch):
    """The streamed text is the final text, held back only while a character is incomplete (the CLI
    once printed U+FFFD there and then nothing more)."""
    from transformers import AutoTokenizer

    from engine.outputs import RequestOutput
    from engine.shipped import shipped_pair

    tokenizer = AutoTokenizer.from_pretrained(str(shipped_pair("tiny")[0]))
    ids = tokenizer.encode("x = 'héllo — 日本'\nprint(x)\n", add_special_tokens=False)
    text = tokenizer.decode(ids, skip_special_tokens=True)

    class Streaming:  # the engine's step() outputs, one token each
        drafter, stats = None, None

        def __init__(self, config):
            self.tokenizer, self.n = tokenizer, 0

        def add_request(self, prompt, params):
            return "req-0"

        def has_unfinished(self):
            return self.n < len(ids)

        def step(self):
            self.n += 1
            done = self.n == len(ids)
            reason, final = ("length", text) if done else (None, "")
            return [RequestOutput("req-0", [1], ids[: self.n], ids[self.n - 1 : self.n], done, reason, text=final)]

    monkeypatch.setattr("engine.engine.Engine", Streaming)
    assert main(["generate", "--prompt", "x", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == text + "\n"
