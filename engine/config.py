"""EngineConfig and SamplingParams: flat dataclasses, validated on construction."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from engine.levers import Levers
from engine.loader import Checkpoint, is_int

if TYPE_CHECKING:  # the policy package imports this module
    from engine.policy.costs import CostTable

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "torch", "triton")
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 0..2**64-1
# Below it sampling is greedy in all but name (vLLM's sampling epsilon), and far below it
# logits / temperature overflows fp32 and the softmax turns to NaN inside a step.
MIN_TEMPERATURE = 1e-5


def _check_int(owner: str, name: str, value: object, low: int, high: int | None = None) -> int:
    """An int (not a bool, not a float, not a string) in [low, high]; returns it as a Python int."""
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{owner}.{name}={value!r}; expected an int {bound}")
    return int(value)


def _check_bool(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name}={value!r}; expected a bool")


def _check_real(owner: str, name: str, value: object) -> float:
    """A finite real number (an int is fine, a bool or a string is not); returns it as a float."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{owner}.{name}={value!r}; expected a finite number")
    return float(value)


@dataclass
class EngineConfig:
    """Flat engine settings. `levers` holds explicit lever values by name (engine/levers.py), e.g.
    {"max_drafts": 4}; a lever not named there is taken from the environment (PEGAINFER_SPEC_*), and an
    explicit value, 0 included, wins over the environment."""

    model: str | os.PathLike | Checkpoint  # a checkpoint directory, a hub repo id, or an in-memory Checkpoint
    draft_model: str | os.PathLike | Checkpoint | None = None
    device: str = "auto"  # auto: cuda when available
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    backend: str = "auto"  # auto: triton on cuda, torch on cpu
    cuda_graphs: bool = True
    decode_overlap: bool = True  # plain greedy decode launches its next step before reading its tokens
    batch_invariant: bool = False
    max_num_seqs: int = 64
    max_model_len: int | None = None  # default: min(model limits, 4096)
    max_num_batched_tokens: int = 8192
    kv_block_size: int = 16
    num_kv_blocks: int | None = None  # default: enough for max_num_seqs x max_model_len, within memory
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    levers: Mapping[str, object] = field(default_factory=dict)
    trace: bool | None = None  # per-round trace lines; None: PEGAINFER_TEST_LOG
    cost_table: str | os.PathLike | CostTable | None = None  # policy=adaptive; None: PEGAINFER_SPEC_COST_TABLE

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("EngineConfig.model is required (a checkpoint directory or hub repo id)")
        for name in ("model", "draft_model"):
            value = getattr(self, name)
            if not (value is None and name == "draft_model" or isinstance(value, (str, os.PathLike, Checkpoint))):
                raise ValueError(f"EngineConfig.{name}={value!r}; expected a path, a hub repo id or a Checkpoint")
        for name, value, allowed in (
            ("device", self.device, DEVICES),
            ("dtype", self.dtype, DTYPES),
            ("backend", self.backend, BACKENDS),
        ):
            if value not in allowed:
                raise ValueError(f"EngineConfig.{name}={value!r}; expected one of {allowed}")
        for name in ("cuda_graphs", "decode_overlap", "batch_invariant"):
            _check_bool("EngineConfig", name, getattr(self, name))
        if self.trace is not None:
            _check_bool("EngineConfig", "trace", self.trace)
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_block_size"):
            setattr(self, name, _check_int("EngineConfig", name, getattr(self, name), 1))
        for name in ("max_model_len", "num_kv_blocks"):
            if getattr(self, name) is not None:
                setattr(self, name, _check_int("EngineConfig", name, getattr(self, name), 2))
        # Request streams are seeded with seed * 1_000_003 + request index, which must stay below 2**64.
        self.seed = _check_int("EngineConfig", "seed", self.seed, 0, 2**32 - 1)
        self.gpu_memory_utilization = _check_real("EngineConfig", "gpu_memory_utilization", self.gpu_memory_utilization)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if isinstance(self.levers, Levers):
            self.levers = dataclasses.asdict(self.levers)
        if not isinstance(self.levers, Mapping):
            raise ValueError(f"EngineConfig.levers={self.levers!r}; expected a mapping of lever names to values")
        Levers().replace(self.levers)  # names and values checked here; the environment at engine start
        from engine.policy.costs import CostTable

        if not (self.cost_table is None or isinstance(self.cost_table, (str, os.PathLike, CostTable))):
            raise ValueError(f"EngineConfig.cost_table={self.cost_table!r}; expected a CSV path or a CostTable")


MAX_LOGPROBS = 20
_SP = "SamplingParams"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None  # None: derived from the engine seed and the request id
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    speculate: bool = True  # False: this request never drafts (its batch falls back to plain decode)
    stop: tuple[str, ...] = ()  # stop strings: the output ends at the token completing one, text trimmed before it
    min_tokens: int = 0  # stop tokens (EOS included) and stop strings are ignored until this many are output
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's log-probability plus the top k

    def __post_init__(self) -> None:
        put = partial(object.__setattr__, self)  # frozen: normalised values are set past __setattr__
        put("max_tokens", _check_int(_SP, "max_tokens", self.max_tokens, 1))
        put("temperature", _check_real(_SP, "temperature", self.temperature))
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"SamplingParams.temperature={self.temperature!r} is below {MIN_TEMPERATURE} (greedy in all but "
                "name, and too small to sample from in fp32); use 0 for greedy"
            )
        put("top_k", _check_int(_SP, "top_k", self.top_k, 0))  # 0: off
        put("top_p", _check_real(_SP, "top_p", self.top_p))
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            put("seed", _check_int(_SP, "seed", self.seed, 0, SEED_MAX))
        for name in ("ignore_eos", "speculate"):
            _check_bool(_SP, name, getattr(self, name))
        ids = self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"SamplingParams.stop_token_ids={ids!r}; expected a sequence of token ids")
        ids = tuple(ids)
        bad = [t for t in ids if not is_int(t) or t < 0]
        if bad:
            raise ValueError(f"SamplingParams.stop_token_ids={list(ids)!r}: {bad[0]!r} is not an int >= 0")
        put("stop_token_ids", tuple(int(t) for t in ids))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (tuple, list)) or not all(isinstance(t, str) and t for t in stop):
            raise ValueError(f"SamplingParams.stop must be non-empty strings, got {self.stop!r}")
        put("stop", tuple(stop))
        put("min_tokens", _check_int(_SP, "min_tokens", self.min_tokens, 0))
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        if self.logprobs is not None:
            put("logprobs", _check_int(_SP, "logprobs", self.logprobs, 0, MAX_LOGPROBS))

    def validate_for(self, vocab_size: int) -> None:
        """What depends on the model: every stop token id inside its vocabulary [0, vocab_size)."""
        outside = [t for t in self.stop_token_ids if t >= vocab_size]
        if outside:
            raise ValueError(f"SamplingParams.stop_token_ids: {outside[0]} is outside the vocabulary [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
