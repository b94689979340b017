"""Programmatic dependent launch: which launches get it, and on a GPU one Qwen3-4B decoder layer of
Triton kernels replayed from a CUDA graph with PDL computes what the plain launches compute (a kernel
that read its predecessor's output before the wait would be off by O(1), not by rounding)."""

from __future__ import annotations

import pytest
import torch

from engine.bench.geometry import QWEN3_4B as QWEN3_4B_CONFIG
from engine.kernels import _triton, get_ops
from engine.kernels.rope import rope_cos_sin
from engine.models.config import Geometry
from engine.models.layers import AttnMeta, LayerWeights, decoder_layer
from tests.kernel_helpers import CUDA, capture_graph, gpu, randn, rel_err


def test_pdl_off_on_cpu_and_when_switched_off(monkeypatch):
    assert _triton.pdl(torch.device("cpu")) == {"PDL": False}
    if CUDA:
        monkeypatch.setattr(_triton, "PDL", False)
        assert _triton.pdl(torch.device("cuda")) == {"PDL": False}


def layer_inputs(batch: int, ctx: int, page: int = 16):
    g = Geometry.from_dict(QWEN3_4B_CONFIG, "test")
    bf, h, d = torch.bfloat16, g.hidden_size, g.head_dim
    w = LayerWeights(
        input_norm=randn(h, dtype=bf).abs().add(0.5),
        qkv=randn(g.q_size + 2 * g.kv_size, h, dtype=bf, scale=0.05),
        q_norm=randn(d, dtype=bf).abs().add(0.5),
        k_norm=randn(d, dtype=bf).abs().add(0.5),
        o=randn(h, g.q_size, dtype=bf, scale=0.05),
        post_norm=randn(h, dtype=bf).abs().add(0.5),
        gate_up=randn(2 * g.intermediate_size, h, dtype=bf, scale=0.05),
        down=randn(h, g.intermediate_size, dtype=bf, scale=0.05),
    )
    per = -(-(ctx + 1) // page)
    tables = torch.arange(batch * per, dtype=torch.int32, device="cuda").view(batch, per)
    slots = (tables[:, ctx // page].long() * page + ctx % page).contiguous()
    meta = AttnMeta(
        slot_mapping=slots,
        block_tables=tables,
        seq_lens=torch.full((batch,), ctx + 1, dtype=torch.int32, device="cuda"),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        max_query_len=1,
    )
    cache = randn(batch * per, page, g.num_kv_heads, d, dtype=bf)
    x, residual = randn(batch, h, dtype=bf), randn(batch, h, dtype=bf)
    positions = torch.full((batch,), ctx, dtype=torch.int64, device="cuda")
    return g, w, meta, cache, x, residual, positions


@gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_gpu_decoder_layer_with_pdl_in_a_graph(batch, monkeypatch):
    torch.manual_seed(30)
    g, w, meta, cache, x, residual, positions = layer_inputs(batch, ctx=200)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(4096, g.head_dim, g.rope_theta, "cuda")
    assert _triton.pdl(x.device) == {"PDL": True, "launch_pdl": True}  # an H100/H200 class device

    def run(kc, vc):
        return decoder_layer(ops, g, w, x, residual, positions, meta, kc, vc, cos_sin)

    monkeypatch.setattr(_triton, "PDL", False)
    plain_caches = cache.clone(), cache.clone()
    plain = run(*plain_caches)
    monkeypatch.setattr(_triton, "PDL", True)
    caches = cache.clone(), cache.clone()
    graph, out = capture_graph(lambda: run(*caches))
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip((*out, *caches), (*plain, *plain_caches), strict=True):
            assert rel_err(got, want) < 1e-3, batch
