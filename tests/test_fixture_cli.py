"""The CLI end to end on the micro recipe: build --out/--tar writes the layout, eval reads it."""

from __future__ import annotations

import json
import tarfile

import torch

from engine.fixture.__main__ import main
from engine.fixture.build import LAYOUT


def test_build_out_tar_then_eval(tmp_path, capsys):
    out, tar = tmp_path / "pair", tmp_path / "pair.tar"
    (out).mkdir()
    (out / "README").write_text("kept")  # --out replaces the layout entries, nothing else
    assert (
        main(
            [
                "build",
                "--recipe",
                "micro",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--tar",
                str(tar),
                "--set",
                "eval_prompts=1",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == sorted([*LAYOUT, "README"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["eval_prompts"] == 1 and manifest["seed"] == 0
    assert "--recipe micro" in manifest["command"]
    assert manifest["bytes_on_disk"]["pair_total"] > 0 and manifest["eval"]["lossless_mismatches"] == 0
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert {
        "target/config.json",
        "target/tokenizer.json",
        "drafter/model.safetensors",
        "prompts.jsonl",
        "manifest.json",
    } <= set(names)
    capsys.readouterr()
    assert main(["eval", "--pair", str(out), "--device", "cpu", "--max-new-tokens", "6", "--check-lossless"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompts"] == 1 and result["lossless_mismatches"] == 0 and result["tau"] >= 1.0


def test_build_is_deterministic_for_a_seed(tmp_path):
    from engine.fixture.build import build_pair
    from engine.fixture.recipes import MICRO

    for name in ("a", "b"):
        build_pair(MICRO, tmp_path / name, device="cpu", seed=5)
    for sub in ("target", "drafter"):
        for f in sorted((tmp_path / "a" / sub).iterdir()):
            assert f.read_bytes() == (tmp_path / "b" / sub / f.name).read_bytes(), f
    assert (tmp_path / "a" / "prompts.jsonl").read_text() == (tmp_path / "b" / "prompts.jsonl").read_text()
    hashes = [json.loads((tmp_path / n / "manifest.json").read_text())["weights_sha256"] for n in ("a", "b")]
    assert hashes[0] == hashes[1] and set(hashes[0]) == {"target/model.safetensors", "drafter/model.safetensors"}
    assert not torch.are_deterministic_algorithms_enabled()  # the build's setting does not leak
