"""The corpus: deterministic file list without tests, a stable three-way split, held-out prompts."""

from __future__ import annotations

from engine.fixture.corpus import bucket, heldout_prompts, load_corpus


def test_split_is_stable_disjoint_and_testless():
    a = load_corpus(heldout_percent=5, max_bytes=600_000, drafter_percent=10)
    b = load_corpus(heldout_percent=5, max_bytes=600_000, drafter_percent=10)
    assert a.fingerprint() == b.fingerprint()
    keys = [f.key for f in (*a.train, *a.heldout, *a.drafter)]
    assert len(keys) == len(set(keys))
    assert all(bucket(f.key) < 5 for f in a.heldout)
    assert all(5 <= bucket(f.key) < 15 for f in a.drafter)
    assert all(bucket(f.key) >= 15 for f in a.train)
    for k in keys:
        parts = k.split("/")
        assert not {"test", "tests", "idle_test", "site-packages", "encodings"} & set(parts[:-1]), k
        assert not parts[-1].startswith("test_"), k
    assert [f.relpath for f in a.train] == sorted(f.relpath for f in a.train)
    # Growing the drafter split only moves files out of train; the held-out set does not change.
    c = load_corpus(heldout_percent=5, max_bytes=600_000, drafter_percent=0)
    assert [f.key for f in c.heldout] == [f.key for f in a.heldout]


def test_heldout_prompts_shape():
    corpus = load_corpus(heldout_percent=30, max_bytes=400_000)
    count = lambda s: len(s.split())  # a stand-in tokenizer: whitespace words
    prompts = heldout_prompts(corpus.heldout, count, n=8, min_tokens=10, max_tokens=30, min_rest_tokens=20)
    assert [p["id"] for p in prompts] == [f"heldout-{i:03d}" for i in range(len(prompts))]
    assert len(prompts) == 8
    texts = {f.key: f.text for f in corpus.heldout}
    for p in prompts:
        assert set(p) == {"id", "text", "source"}
        key, line = p["source"].rsplit(":", 1)
        src_lines = texts[key].splitlines(keepends=True)
        start = int(line) - 1
        assert "".join(src_lines[start:]).startswith(p["text"])  # whole lines from the def/class line
        assert p["text"].endswith("\n") and 10 <= count(p["text"]) <= 30
        assert p["text"].lstrip().startswith(("def ", "class ", "async def ", "@"))
