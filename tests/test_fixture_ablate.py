"""`python -m engine.fixture ablate` on the micro recipe: prepare once, then a variant against it."""

from __future__ import annotations

import json

import pytest

from engine.fixture.__main__ import main


def test_ablate_prepare_then_variant(tmp_path):
    d, out = tmp_path / "abl", tmp_path / "out"
    common = ["--recipe", "micro", "--device", "cpu", "--dir", str(d)]
    assert main(["ablate", "prepare", *common]) == 0
    prepared = json.loads((d / "prepare.json").read_text())
    assert prepared["pool"][0] == 8 and prepared["target_heldout_loss"] > 0
    args = ["ablate", "variant", *common, "--name", "b2", "--out", str(out), "--new-tokens", "6"]
    assert main([*args, "--set", "drafter_batch=2"]) == 0
    result = json.loads((out / "ablation-b2.json").read_text())
    assert result["recipe"]["drafter_batch"] == 2 and result["eval6"]["tau"] >= 1.0
    assert len(result["tf_acc_heldout"]) == len(result["tf_acc_train_last_batch"])
    assert (d / "drafter-b2" / "model.safetensors").is_file()


def test_ablate_variant_needs_a_name_and_an_out(tmp_path):
    with pytest.raises(SystemExit, match="--name and --out"):
        main(["ablate", "variant", "--recipe", "micro", "--device", "cpu", "--dir", str(tmp_path)])


def test_ablate_refuses_an_unknown_recipe_field(tmp_path):
    with pytest.raises(ValueError, match="bad override"):
        main(["ablate", "prepare", "--recipe", "micro", "--dir", str(tmp_path), "--set", "drafter_bach=2"])
