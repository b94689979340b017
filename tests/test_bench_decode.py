"""The decode bench: roofline arithmetic for the Qwen3-4B geometry against hand computation, the random
geometries against the real module layouts, and the bench end to end on CPU (engine vs HF peer)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from engine.bench import decode, roofline
from engine.bench.decode_report import roofline_columns
from engine.bench.report import read_csv
from engine.fixture.known.geometry import drafter_config, drafter_shapes, target_config, target_shapes
from engine.models.config import DFlashConfig, Qwen3Config

CFG_4B = target_config("4b")
# Qwen3-4B by hand: embedding (= tied head) 151936 x 2560; per layer q 4096x2560, k and v 1024x2560,
# o 2560x4096, gate/up/down 9728x2560, norms 2x2560 + 2x128; final norm 2560.
EMBED = 151936 * 2560
LINEAR = 4096 * 2560 + 2 * 1024 * 2560 + 2560 * 4096 + 3 * 9728 * 2560
LAYER = LINEAR + 2 * 2560 + 2 * 128
PARAMS = EMBED + 36 * LAYER + 2560
KV_TOKEN = 36 * 2 * 8 * 128 * 2


pytestmark = pytest.mark.usefixtures("one_thread")


def test_4b_weight_and_kv_bytes_by_hand():
    assert (EMBED, LAYER, PARAMS) == (388_956_160, 100_930_816, 4_022_468_096)
    assert roofline.param_count(CFG_4B) == PARAMS
    assert roofline.weight_bytes(CFG_4B) == 2 * PARAMS == 8_044_936_192  # ~8.05 GB, the tied head once
    assert roofline.kv_bytes_per_token(CFG_4B) == KV_TOKEN == 147_456
    untied = {**CFG_4B, "tie_word_embeddings": False}
    assert roofline.weight_bytes(untied) == 2 * (PARAMS + EMBED)


def test_4b_decode_step_bytes_and_prefill_flops_by_hand():
    # c=64 at the mean context of a 128 -> 128 run (128 + 64 tokens)
    ctx = roofline.decode_contexts(64, 128, 64)
    assert ctx == [192] * 64
    assert roofline.decode_step_bytes(CFG_4B, ctx) == 8_044_936_192 + 64 * 192 * 147_456 == 9_856_875_520
    dense = 2 * 64 * 128 * 36 * LINEAR
    head = 2 * 64 * EMBED
    attn = 64 * 2 * 128 * 129 * 128 * 32 * 36  # QK^T + PV over 128*129/2 causal pairs, 32 heads of 128
    assert roofline.prefill_flops(CFG_4B, [128] * 64) == pytest.approx(dense + head + attn, rel=1e-12)
    assert 59e12 < dense + head + attn < 61e12


def test_workload_floor_by_hand():
    bw, rate = 4.0e12, 700e12
    floor = roofline.workload_floor(CFG_4B, batch=2, prompt_len=4, new_tokens=3, bandwidth=bw, flop_rate=rate)
    w = 8_044_936_192
    prefill = max(roofline.prefill_flops(CFG_4B, [4, 4]) / rate, (w + 2 * 4 * KV_TOKEN) / bw)
    decode_bytes = [w + 2 * 5 * KV_TOKEN, w + 2 * 6 * KV_TOKEN]  # decode steps 1 and 2 read 5 and 6 tokens
    assert floor.prefill_s == pytest.approx(prefill)
    assert floor.decode_s == pytest.approx(sum(decode_bytes) / bw)  # weight-bound at batch 2
    assert floor.decode_step_bytes_mean == pytest.approx(sum(decode_bytes) / 2)
    assert floor.total_s == pytest.approx(prefill + sum(decode_bytes) / bw)
    # c=64, 128 -> 128 at 4.3 TB/s and 700 TFLOP/s: 127 weight-bound steps of ~9.86 GB + a compute-bound prefill
    big = roofline.workload_floor(CFG_4B, 64, 128, 128, 4.3e12, 700e12)
    assert big.decode_s == pytest.approx(127 * 9_856_875_520 / 4.3e12, rel=1e-12)
    assert big.prefill_s == pytest.approx(roofline.prefill_flops(CFG_4B, [128] * 64) / 700e12)


def test_roofline_columns_fractions():
    cols = roofline_columns(CFG_4B, 64, 128, 128, bw=4.3e12, rate=700e12, step_ms=4.0, wall_s=1.0)
    assert cols["step_gb"] == pytest.approx(9.856875520)
    assert cols["floor_step_ms"] == pytest.approx(9_856_875_520 / 4.3e12 * 1e3)
    assert cols["bw_fraction"] == pytest.approx(cols["floor_step_ms"] / 4.0)
    assert cols["floor_fraction"] == pytest.approx(cols["floor_ms"] / 1e3)


def test_random_geometries_match_the_real_module_layouts():
    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM

    from engine.fixture.dflash_model import DFlashDraftModel

    cfg = target_config("tiny")
    hf = Qwen3ForCausalLM(HFConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    assert target_shapes(cfg) == theirs
    dcfg = drafter_config("tiny")
    with torch.device("meta"):
        ref = DFlashDraftModel(DFlashConfig.from_dict(dcfg))
    assert drafter_shapes(dcfg) == {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def test_dflash_4b_drafter_fits_the_4b_target():
    d = DFlashConfig.from_dict(drafter_config("4b"))
    d.check_fits(Qwen3Config.from_dict(CFG_4B))
    assert (d.geometry.num_layers, d.block_size, d.target_layer_ids, d.drafts_per_round) == (
        5,
        16,
        (1, 9, 17, 25, 33),
        15,
    )
    assert sum(math.prod(s) for s in drafter_shapes(drafter_config("4b")).values()) == pytest.approx(537e6, rel=1e-3)


def test_decode_bench_end_to_end_on_cpu(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "1", "2"]
    argv += ["--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--peer-repeats", "1"]
    argv += ["--copy-mib", "8", "--gemm-n", "64", "--check-tokens", "3"]
    assert decode.main(argv) == 0
    runs = read_csv(tmp_path / "decode_runs.csv")
    assert sorted((r["impl"], r["concurrency"]) for r in runs) == [
        ("hf", "1"),
        ("hf", "2"),
        ("hf-eager", "1"),
        ("hf-eager", "2"),
        ("pegaspec", "1"),
        ("pegaspec", "2"),
    ]
    for r in runs:
        assert int(r["output_tokens"]) == 3 * int(r["concurrency"]) and float(r["tok_s"]) > 0
        if r["impl"] == "hf":  # transformers compiles on a GPU only: on CPU the default is eager too
            assert r["compiled"] == "False" and float(r["warmup_s"]) > 0
        if r["impl"] == "pegaspec":
            assert int(r["decode_steps"]) == 2 and float(r["step_ms"]) > 0  # 3 tokens: a prefill + 2 decodes
    meta = json.loads((tmp_path / "decode.json").read_text())
    assert meta["agreement"]["agree_prefix"] == 3  # fp32 on CPU: the same weights give the same greedy tokens
    assert meta["agreement"]["logits_rel_err"] < 1e-4  # and the same logits: the weights were handed over intact
    assert meta["hw"]["kv_bytes_per_token"] == 6 * 2 * 2 * 64 * 4  # tiny recipe geometry in fp32
    for s in meta["summary"]:
        assert s["vs_peer"] == pytest.approx(s["tok_s"] / s["peer_tok_s"]) and s["peer_eager_tok_s"] > 0
        assert s["bw_fraction"] > 0 and s["floor_fraction"] > 0
    assert meta["peer_failures"] == []
    out = capsys.readouterr().out
    assert "| c | tok/s | HF tok/s | vs HF | HF eager tok/s |" in out and "NOT compiled on this device" in out


def test_decode_bench_reports_a_peer_warmup_past_its_cap(tmp_path, monkeypatch):
    def slow(*args):
        time.sleep(5)

    monkeypatch.setattr(decode, "time_hf_generate", slow)
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "1", "2"]
    argv += ["--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--copy-mib", "8", "--gemm-n", "64"]
    argv += ["--peer-modes", "compiled", "--peer-warmup-cap-s", "0.2", "--check-tokens", "0"]
    assert decode.main(argv) == 0
    meta = json.loads((tmp_path / "decode.json").read_text())
    (failure,) = meta["peer_failures"]  # the first shape's failure ends the mode
    assert (failure["mode"], failure["concurrency"]) == ("compiled", 1) and "exceeded" in failure["error"]
    assert meta["summary"][0]["peer_tok_s"] is None
    assert "warm-up failed" in (tmp_path / "decode.md").read_text()


def test_decode_bench_refuses_an_unknown_peer_mode(tmp_path):
    with pytest.raises(SystemExit):
        decode.main(["--out", str(tmp_path), "--peer-modes", "fast"])


def test_decode_bench_without_peer(tmp_path):
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "1", "--no-peer"]
    argv += ["--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--copy-mib", "8", "--gemm-n", "64"]
    assert decode.main(argv) == 0
    meta = json.loads((tmp_path / "decode.json").read_text())
    assert meta["agreement"] is None and meta["summary"][0]["peer_tok_s"] is None
