"""The fixture cache: hit on a second build, miss on a changed recipe, one artifact under
concurrent builders, atomic publish; and one real micro build end to end."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from engine.fixture.cache import ensure_built, ensure_pair
from engine.fixture.corpus import Corpus, SourceFile
from engine.fixture.recipes import MICRO, Recipe, get_recipe

CORPUS = Corpus(train=[SourceFile("stdlib", "a.py", "x = 1\n")], heldout=[SourceFile("stdlib", "b.py", "y = 2\n")])


class FakeBuilder:
    def __init__(self, delay: float = 0.0):
        self.calls = 0
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, r: Recipe, out, device: str, seed: int, corpus: Corpus):
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        (out / "target").mkdir()
        (out / "drafter").mkdir()
        (out / "manifest.json").write_text(json.dumps({"recipe": r.to_dict(), "seed": seed}))


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PEGASPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_hit_and_miss(cache_env):
    b = FakeBuilder()
    first = ensure_built(MICRO, "cpu", 0, builder=b, corpus=CORPUS)
    assert first.parent == cache_env and first.name.startswith("micro-")
    assert ensure_built(MICRO, "cpu", 0, builder=b, corpus=CORPUS) == first
    assert b.calls == 1
    changed = dataclasses.replace(MICRO, target_steps=MICRO.target_steps + 1)
    assert ensure_built(changed, "cpu", 0, builder=b, corpus=CORPUS) != first
    assert ensure_built(MICRO, "cpu", 1, builder=b, corpus=CORPUS) != first  # seed is part of the key
    other = Corpus(train=[SourceFile("stdlib", "a.py", "x = 2\n")], heldout=CORPUS.heldout)
    assert ensure_built(MICRO, "cpu", 0, builder=b, corpus=other) != first  # so is the corpus
    assert b.calls == 4


def test_concurrent_builders_make_one_artifact(cache_env):
    b = FakeBuilder(delay=0.5)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_built(MICRO, "cpu", 0, builder=b, corpus=CORPUS)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.calls == 1
    assert len(set(results)) == 1 and len(results) == 3
    entries = sorted(p.name for p in cache_env.iterdir() if not p.name.endswith(".lock"))
    assert entries == [results[0].name]  # no temp dirs left behind


def test_failed_build_publishes_nothing(cache_env):
    def broken(r, out, device, seed, corpus):
        (out / "target").mkdir()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ensure_built(MICRO, "cpu", 0, builder=broken, corpus=CORPUS)
    assert [p for p in cache_env.iterdir() if not p.name.endswith(".lock")] == []


def test_overrides_and_key():
    r = get_recipe("tiny").with_overrides(["target_steps=7", "target_layer_ids=1,2", "target_lr=0.5"])
    assert (r.target_steps, r.target_layer_ids, r.target_lr) == (7, (1, 2), 0.5)
    assert r.key(0, "c") != get_recipe("tiny").key(0, "c")
    assert get_recipe("tiny").key(0, "c") == get_recipe("tiny").key(0, "c")
    with pytest.raises(ValueError):
        r.with_overrides(["nope=1"])


def test_real_micro_build_via_ensure_pair(cache_env, monkeypatch):
    from engine.fixture import cache
    from engine.fixture.check import check_pair

    target_dir, drafter_dir = ensure_pair("micro", device="cpu")
    root = target_dir.parent
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["recipe"]["name"] == "micro" and manifest["eval"]["lossless_mismatches"] == 0
    assert (root / "prompts.jsonl").read_text().count("\n") == MICRO.eval_prompts
    check_pair(target_dir, drafter_dir)
    monkeypatch.setattr(cache, "build_pair", lambda *a, **k: pytest.fail("a cache hit builds nothing"))
    assert ensure_pair("micro", device="cpu") == (target_dir, drafter_dir)
