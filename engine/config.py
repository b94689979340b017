"""EngineConfig and SamplingParams: flat dataclasses, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.loader import Checkpoint

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "torch", "triton")


@dataclass
class EngineConfig:
    """Every lever is a field. `spec_*` fields left at None are taken from the environment
    (PEGAINFER_SPEC_*); an explicit value, 0 included, wins over the environment."""

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
    spec_max_batch: int | None = None
    spec_max_drafts: int | None = None
    spec_hedge: int | None = None
    spec_hedge_positions: tuple[int, ...] | None = None
    spec_hedge_auto: bool | None = None
    spec_hedge_knee: int | None = None
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
        for name in ("spec_max_batch", "spec_max_drafts", "spec_hedge", "spec_hedge_knee"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"EngineConfig.{name}={value!r}; expected an int >= 0 (0 = off) or None")
        positions = self.spec_hedge_positions
        if positions is not None:
            if isinstance(positions, (str, bytes)) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions
            ):
                raise ValueError(f"EngineConfig.spec_hedge_positions={positions!r}; expected counts >= 0")
            self.spec_hedge_positions = tuple(positions)
        if self.spec_hedge_auto is not None and not isinstance(self.spec_hedge_auto, bool):
            raise ValueError(f"EngineConfig.spec_hedge_auto={self.spec_hedge_auto!r}; expected a bool or None")


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
