"""The fixture tokenizer: byte-level BPE that round-trips code exactly and loads with AutoTokenizer."""

from __future__ import annotations

import pytest

from engine.fixture.corpus import load_corpus
from engine.fixture.tokenizer import EOS, MASK, encode_stream, save_tokenizer, special_ids, train_tokenizer

SNIPPETS = [
    "def f(x):\n    return x + 1\n",
    "class A:\n\tdef g(self):\t# tab-indented\n\t\treturn 'ünïcödé ✓ 日本語 🐍'\n",
    "x = 1   \n\n   \ny = 2\t \n",  # trailing spaces and tabs, whitespace-only lines
    "    leading = 'spaces'\r\nwindows = True\r\n",
    "s = '\\x00\\u2028' \u00a0 # nbsp\n",
    "",
    " ",
    "if a:\n        pass\n",
]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(heldout_percent=25, max_bytes=300_000)


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer((f.text for f in corpus.train), 512)


def test_specials_and_vocab(tok):
    eos, mask = special_ids(tok)
    assert (eos, mask) == (0, 1)
    assert tok.get_vocab_size() <= 512


@pytest.mark.parametrize("text", SNIPPETS)
def test_roundtrip_snippets(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_roundtrip_corpus_files(tok, corpus):
    for f in corpus.heldout:
        assert tok.decode(tok.encode(f.text).ids) == f.text, f.relpath


def test_autotokenizer_loads_and_matches(tok, corpus, tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer(tok, tmp_path, 2048)
    at = AutoTokenizer.from_pretrained(str(tmp_path))
    assert at.eos_token == EOS and at.eos_token_id == 0
    assert at.mask_token == MASK and at.mask_token_id == 1
    for text in [*SNIPPETS, corpus.heldout[0].text[:2000]]:
        ids = at.encode(text, add_special_tokens=False)
        assert ids == tok.encode(text).ids
        assert at.decode(ids) == text


def test_encode_stream_separates_files_with_eos(tok):
    s = encode_stream(tok, ["a = 1\n", "b = 2\n"])
    eos, _ = special_ids(tok)
    assert (s == eos).sum() == 2 and int(s[-1]) == eos
