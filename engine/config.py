"""EngineConfig and SamplingParams: flat dataclasses, validated on construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.levers import Levers
from engine.loader import Checkpoint

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "torch", "triton")


@dataclass
class EngineConfig:
    """Flat engine settings. `levers` holds explicit lever values by name (engine/levers.py), e.g.
    {"max_drafts": 4}; a lever not named there is taken from the environment (PEGAINFER_SPEC_*), and an
    explicit value, 0 included, wins over the environment."""

    model: str | Checkpoint  # a checkpoint directory, a hub repo id, or an in-memory Checkpoint
    draft_model: str | Checkpoint | None = None
    device: str = "auto"  # auto: cuda when available
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    backend: str = "auto"  # auto: triton on cuda, torch on cpu
    cuda_graphs: bool = True
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

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("EngineConfig.model is required (a checkpoint directory or hub repo id)")
        for name, value, allowed in (
            ("device", self.device, DEVICES),
            ("dtype", self.dtype, DTYPES),
            ("backend", self.backend, BACKENDS),
        ):
            if value not in allowed:
                raise ValueError(f"EngineConfig.{name}={value!r}; expected one of {allowed}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_block_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"EngineConfig.num_kv_blocks must be >= 2, got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if isinstance(self.levers, Levers):
            self.levers = dataclasses.asdict(self.levers)
        if not isinstance(self.levers, Mapping):
            raise ValueError(f"EngineConfig.levers={self.levers!r}; expected a mapping of lever names to values")
        Levers().replace(self.levers)  # names and values checked here; the environment at engine start
        if self.trace is not None and not isinstance(self.trace, bool):
            raise ValueError(f"EngineConfig.trace={self.trace!r}; expected a bool or None")


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

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
