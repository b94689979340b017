"""The HF transformers peer: the same random weights in a Qwen3ForCausalLM, greedy `generate` with a
static cache, compiled (transformers' default on a GPU) or eager (`disable_compile`)."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

import torch

from engine.loader import Checkpoint
from engine.timing import sync

_NOT_HF_KWARGS = ("architectures", "model_type")


def build_hf_model(config: dict, device: torch.device, dtype: torch.dtype, std: float = 0.02, seed: int = 0):
    """A Qwen3ForCausalLM built on the device with norms 1 and every other weight N(0, std), seeded."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_cfg = Qwen3Config(**{k: v for k, v in config.items() if k not in _NOT_HF_KWARGS}, attn_implementation="sdpa")
    torch.manual_seed(seed)
    # Built in `dtype` (as from_pretrained does), not cast after: .to(bf16) would also round the fp32
    # RoPE inv_freq buffer and the peer would no longer compute what the engine computes.
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied head is the embedding: listed once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
    model.generation_config.eos_token_id = None  # random weights: never stop early
    model.generation_config.pad_token_id = 0
    return model


def as_checkpoint(model, config: dict, name: str) -> Checkpoint:
    """The model's own tensors (no copy) as an in-memory checkpoint for the engine."""
    return Checkpoint(name, dict(config), tensors=dict(model.state_dict()))


PEER_MODES = ("compiled", "eager")


class PeerTimeout(RuntimeError):
    """A peer call (in practice its first-call compilation) ran past its cap."""


@contextmanager
def deadline(seconds: float | None):
    """Raise PeerTimeout in the main thread once `seconds` have passed (None: no cap; SIGALRM, so Unix
    and the main thread only)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise PeerTimeout(f"exceeded {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def compiled(model) -> bool:
    """Did generate compile the forward (transformers keeps the compiled call on the model)?"""
    return hasattr(model, "_compiled_call")


def hf_generate(model, prompts: torch.Tensor, new_tokens: int, mode: str = "eager") -> torch.Tensor:
    """Greedy continuation ids [c, new_tokens] of equal-length prompts [c, P]; raises if it stopped early.
    mode "compiled" leaves transformers' default compilation on (it compiles on a GPU only)."""
    if mode not in PEER_MODES:
        raise ValueError(f"unknown peer mode {mode!r}; expected one of {PEER_MODES}")
    with torch.inference_mode():
        how = dict(do_sample=False, max_new_tokens=new_tokens, cache_implementation="static", pad_token_id=0)
        out = model.generate(
            input_ids=prompts, attention_mask=torch.ones_like(prompts), **how, disable_compile=mode == "eager"
        )
    got = out.shape[1] - prompts.shape[1]
    if got != new_tokens:
        raise RuntimeError(f"HF generate produced {got} tokens, expected {new_tokens}")
    return out[:, prompts.shape[1] :]


def time_hf_generate(model, prompts: torch.Tensor, new_tokens: int, mode: str = "eager") -> float:
    """Wall seconds of one generate call (prefill included), synchronized at both ends."""
    sync(prompts.device)
    t0 = time.perf_counter()
    hf_generate(model, prompts, new_tokens, mode)
    sync(prompts.device)
    return time.perf_counter() - t0
