"""Shared setup of the kernel tests (tests/test_kernels_*.py): Triton kernels against their torch
references.

On CPU the kernels run under the Triton interpreter (fp32/fp16, small shapes); on a CUDA host the
same tests run compiled, plus the GPU-only checks (bf16, Qwen3-4B shapes, batch-invariance
bit-exactness, CUDA-graph replay). Every output and cache is poisoned (NaN / sentinel) before a
run, so an element a kernel fails to write cannot match its reference by accident: each test module
imports the autouse `poison_empty` fixture from here.

Tolerance policy: relative error = ||out - ref|| / ||ref|| (fp32 math on both sides), bounded per
dtype by TOL; kernels that only select or compare (argmax, accept_prefix, cache copies of v, the
residual sum) must match exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # must precede the first kernel launch (kernels bind triton lazily, see _triton.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed: the triton backend cannot be tested")

import numpy as np  # noqa: E402

from engine.fixture.known.geometry import QWEN3_4B as QWEN3_4B_CONFIG  # noqa: E402
from engine.kernels import activation, fused_linear, gemm, linear, norm, tuning  # noqa: E402
from engine.kernels.tuning import TunedTables  # noqa: E402
from engine.models.config import Geometry  # noqa: E402
from engine.models.layers import AttnMeta, LayerWeights  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Attention rounds the probabilities to the KV dtype before the PV product.
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (bf16, 4B shapes, graphs)")
POISON_INT = -7777
QWEN3_4B = dict(hidden=2560, hq=32, hkv=8, d=128, inter=9728, vocab=151936)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "kernel output has NaN/inf (an unwritten or misread element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """torch.empty / empty_like return NaN (float) or POISON_INT (int) filled tensors."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool and t.numel():
            t.fill_(POISON_INT)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


@pytest.fixture
def row_invariant_dot(monkeypatch):
    """The interpreter's tl.dot is numpy matmul, whose OpenBLAS kernels round a row differently
    depending on its position in the tile. Tensor cores do not, so for the batch-invariance tests
    the interpreter gets a row-independent dot (same products, fixed per-row summation)."""
    if not INTERPRET:
        return
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = np.einsum("mk,kn->mn", a.data.astype(np.float32), b.data.astype(np.float32))
        return interpreter.TensorHandle(out.astype(d.data.dtype) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def use_tables(monkeypatch, tables: TunedTables) -> None:
    """Make `tables` what the kernels find for the test device (as if loaded from its JSON file)."""
    device = torch.empty(0, device=DEV).device
    monkeypatch.setattr(tuning, "_by_device", {(device.type, device.index): tables})


def fused_ref(x, w):
    """The reference's rounding of the activation (in the input dtype), then an fp32 product."""
    return linear.linear_ref(activation.silu_and_mul_ref(x).float(), w.float())


def norm_linear_ref(x, r, nw, eps, w):
    normed, summed = norm.add_rms_norm_ref(x, r, nw, eps)
    return linear.linear_ref(normed.float(), w.float()), summed


def capture_graph(run):
    """`run()` once on a side stream (compiles, loads the tuned tables outside the capture), then
    captured in a CUDA graph: (graph, what the captured call returned)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


def layer_inputs(g: Geometry, batch: int, ctx: int, dtype: torch.dtype, page: int = 16):
    """One decode step of `batch` rows into a decoder layer of geometry g: (weights, AttnMeta, a
    random paged cache to clone for k and v, x, residual, positions), each row at position ctx."""
    h, d = g.hidden_size, g.head_dim
    w = LayerWeights(
        input_norm=randn(h, dtype=dtype).abs().add(0.5),
        qkv=randn(g.q_size + 2 * g.kv_size, h, dtype=dtype, scale=0.05),
        q_norm=randn(d, dtype=dtype).abs().add(0.5),
        k_norm=randn(d, dtype=dtype).abs().add(0.5),
        o=randn(h, g.q_size, dtype=dtype, scale=0.05),
        post_norm=randn(h, dtype=dtype).abs().add(0.5),
        gate_up=randn(2 * g.intermediate_size, h, dtype=dtype, scale=0.05),
        down=randn(h, g.intermediate_size, dtype=dtype, scale=0.05),
    )
    per = -(-(ctx + 1) // page)
    tables = torch.arange(batch * per, dtype=torch.int32, device=DEV).view(batch, per)
    slots = (tables[:, ctx // page].long() * page + ctx % page).contiguous()
    meta = AttnMeta(
        slot_mapping=slots,
        block_tables=tables,
        seq_lens=torch.full((batch,), ctx + 1, dtype=torch.int32, device=DEV),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=DEV),
        max_query_len=1,
    )
    cache = randn(batch * per, page, g.num_kv_heads, d, dtype=dtype)
    x, residual = randn(batch, h, dtype=dtype), randn(batch, h, dtype=dtype)
    positions = torch.full((batch,), ctx, dtype=torch.int64, device=DEV)
    return w, meta, cache, x, residual, positions


def small_geometry() -> Geometry:
    """The Qwen3-4B config shrunk to hidden 64, MLP 128, 4 q heads and 2 kv heads of 16."""
    small = dict(QWEN3_4B_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    return Geometry.from_dict(dict(small, num_key_value_heads=2, head_dim=16), "test")


def record_launches(monkeypatch) -> list:
    """Every gemm.launch result from here on, as the kernels' modules call it (a SplitSum: deferred)."""
    results, real = [], gemm.launch
    monkeypatch.setattr(gemm, "launch", lambda *a, **kw: results.append(real(*a, **kw)) or results[-1])
    for module in (linear, fused_linear):
        monkeypatch.setattr(module, "launch", gemm.launch)
    return results


def run_compiling(*argv: str) -> str:
    """stdout of `python ARGV` in a child with TRITON_INTERPRET unset, so Triton compiles for sm90 on
    any host (the PTX tests, the register reports), run from the repository root."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def compile_in_child(code: str, *args: str):
    """Run `code` in a child (run_compiling) and return the JSON of the last line it prints."""
    return json.loads(run_compiling("-c", code, *args).strip().splitlines()[-1])
