"""Programmatic dependent launch: which launches get it, and on a GPU one Qwen3-4B decoder layer of
Triton kernels replayed from a CUDA graph with PDL computes what the plain launches compute (a kernel
that read its predecessor's output before the wait would be off by O(1), not by rounding)."""

from __future__ import annotations

import pytest
import torch

from engine.fixture.known.geometry import QWEN3_4B as QWEN3_4B_CONFIG
from engine.kernels import _triton, get_ops
from engine.kernels.rotary import rope_cos_sin
from engine.kernels.split_sum import dense
from engine.models.config import Geometry
from engine.models.layers import decoder_layer
from tests.kernel_helpers import capture_graph, gpu, layer_inputs, rel_err


def test_pdl_off_on_cpu():
    assert _triton.pdl(torch.device("cpu")) == {"PDL": False}


def test_launches_over_more_rows_than_the_limit_go_without_pdl(monkeypatch):
    """The row limit on a device that has PDL (sm90 faked, so CI checks the rule without a GPU)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_triton, "sm90", lambda device: True)
    cuda, on = torch.device("cuda"), {"PDL": True, "launch_pdl": True}
    assert _triton.PDL_MAX_ROWS == 64  # the H200 table's largest row bucket: cuBLAS above it
    assert _triton.pdl(cuda, 0) == _triton.pdl(cuda, 64) == on
    assert _triton.pdl(cuda, 65) == _triton.pdl(cuda, 8192) == {"PDL": False}
    monkeypatch.setattr(_triton, "PDL_MAX_ROWS", None)
    assert _triton.pdl(cuda, 8192) == on
    monkeypatch.setattr(_triton, "PDL_MAX_ROWS", -1)  # a limit below every launch: PDL off (the GPU tests' reference)
    assert _triton.pdl(cuda, 0) == {"PDL": False}


@gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_gpu_decoder_layer_with_pdl_in_a_graph(batch, monkeypatch):
    torch.manual_seed(30)
    g = Geometry.from_dict(QWEN3_4B_CONFIG, "test")
    w, meta, cache, x, residual, positions = layer_inputs(g, batch, ctx=200, dtype=torch.bfloat16)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(4096, g.head_dim, g.rope_theta, "cuda")
    assert _triton.pdl(x.device) == {"PDL": True, "launch_pdl": True}  # an H100/H200 class device

    def run(kc, vc):  # o and down may hand back split-K partials: summed here, inside the graph
        mlp_out, summed = decoder_layer(ops, g, w, x, residual, positions, meta, kc, vc, cos_sin)
        return dense(mlp_out), summed

    limit = _triton.PDL_MAX_ROWS
    monkeypatch.setattr(_triton, "PDL_MAX_ROWS", -1)  # every launch without PDL
    plain_caches = cache.clone(), cache.clone()
    plain = run(*plain_caches)
    monkeypatch.setattr(_triton, "PDL_MAX_ROWS", limit)
    caches = cache.clone(), cache.clone()
    graph, out = capture_graph(lambda: run(*caches))
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip((*out, *caches), (*plain, *plain_caches), strict=True):
            assert rel_err(got, want) < 1e-3, batch
