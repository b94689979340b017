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


def text_error(text: str) -> str | None:
    """Why `text` is not valid Unicode text, naming the character: a lone surrogate, or an
    undecodable byte carried in by surrogateescape (argv, file names); None when it is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        if 0xDC80 <= code <= 0xDCFF:
            return f"an undecodable byte 0x{code - 0xDC00:02x} at character {err.start}"
        return f"a lone surrogate U+{code:04X} at character {err.start}"
    return None


def _check_int(owner: str, name: str, value: object, low: int, high: int | None = None, note: str = "") -> int:
    """An int (not a bool, not a float, not a string) in [low, high]; returns it as a Python int. `note`
    follows the expected range in the error."""
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{owner}.{name}={value!r}; expected an int {bound}{note}")
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
    decode_overlap: bool = True  # greedy decode and speculative rounds launch their next step first
    batch_invariant: bool = False
    max_num_seqs: int = 64
    max_model_len: int | None = None  # default: min(model limits, 4096)
    max_num_batched_tokens: int = 8192
    kv_block_size: int = 16
    # The drafter attends to its last draft_window context rows (and up to kv_block_size - 1 more: whole
    # KV blocks); 0: to all of them. A drafter trained short loses acceptance past its training length.
    draft_window: int = 0
    # Blocks allocated in all, of kv_block_size tokens: block 0 is reserved (padded rows point at it)
    # and the hedge scratch comes out of them too, so N gives N - 1 - scratch usable blocks.
    # Default: enough for max_num_seqs x max_model_len, within memory.
    num_kv_blocks: int | None = None
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
        for name, allowed in (("device", DEVICES), ("dtype", DTYPES), ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r}; expected one of {allowed}")
        for name in ("cuda_graphs", "decode_overlap", "batch_invariant"):
            _check_bool("EngineConfig", name, getattr(self, name))
        if self.trace is not None:
            _check_bool("EngineConfig", "trace", self.trace)
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_block_size"):
            setattr(self, name, _check_int("EngineConfig", name, getattr(self, name), 1))
        self.draft_window = _check_int("EngineConfig", "draft_window", self.draft_window, 0, note=" (0: no window)")
        if self.max_model_len is not None:
            self.max_model_len = _check_int("EngineConfig", "max_model_len", self.max_model_len, 2)
        if self.num_kv_blocks is not None:
            why = " (blocks in all: block 0 is reserved, so N blocks hold N - 1 usable, less any hedge scratch)"
            self.num_kv_blocks = _check_int("EngineConfig", "num_kv_blocks", self.num_kv_blocks, 2, note=why)
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
MAX_N = 64  # completions per prompt
_SP = "SamplingParams"


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling, with vLLM's defaults (temperature 1.0: sampled; pass temperature=0
    for greedy). Every field is checked here; a bad value is a ValueError naming it."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0 or -1 (vLLM's value): off
    top_p: float = 1.0
    seed: int | None = None  # None: derived from the engine seed and the request id
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    speculate: bool = True  # False: this request never drafts (its batch falls back to plain decode)
    stop: tuple[str, ...] = ()  # stop strings: the output ends at the token completing one, text trimmed before it
    min_tokens: int = 0  # stop tokens (EOS included) and stop strings are ignored until this many are output
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's log-probability plus the top k
    # vLLM's penalties, applied to the logits before temperature (and before the greedy argmax):
    # presence and frequency count the output so far, repetition the prompt and the output.
    presence_penalty: float = 0.0  # [-2, 2]: minus this for every token already in the output
    frequency_penalty: float = 0.0  # [-2, 2]: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # > 0, 1: off; a seen token's logit divided by it (multiplied if < 0)
    min_p: float = 0.0  # [0, 1]: sampled rows drop tokens below min_p x the most likely one's probability
    n: int = 1  # completions per prompt (generate / chat): RequestOutput.outputs holds n
    skip_special_tokens: bool = True  # the output text (and stop strings) without special tokens
    include_stop_str_in_output: bool = False  # the text keeps the stop string that ended it

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
        put("top_k", _check_int(_SP, "top_k", self.top_k, -1))  # 0 or -1: off
        put("top_p", _check_real(_SP, "top_p", self.top_p))
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            put("seed", _check_int(_SP, "seed", self.seed, 0, SEED_MAX))
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
        for i, text in enumerate(stop):
            if (why := text_error(text)) is not None:
                raise ValueError(f"SamplingParams.stop[{i}] is not valid text: {why}")
        put("stop", tuple(stop))
        put("min_tokens", _check_int(_SP, "min_tokens", self.min_tokens, 0))
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        if self.logprobs is not None:
            put("logprobs", _check_int(_SP, "logprobs", self.logprobs, 0, MAX_LOGPROBS))
        for name, low, high in (("presence_penalty", -2, 2), ("frequency_penalty", -2, 2), ("min_p", 0, 1)):
            put(name, _check_real(_SP, name, getattr(self, name)))
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"SamplingParams.{name} must be in [{low}, {high}], got {getattr(self, name)}")
        put("repetition_penalty", _check_real(_SP, "repetition_penalty", self.repetition_penalty))
        if self.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}")
        put("n", _check_int(_SP, "n", self.n, 1, MAX_N))
        for name in ("ignore_eos", "speculate", "skip_special_tokens", "include_stop_str_in_output"):
            _check_bool(_SP, name, getattr(self, name))

    def validate_for(self, vocab_size: int) -> None:
        """What depends on the model: every stop token id inside its vocabulary [0, vocab_size)."""
        outside = [t for t in self.stop_token_ids if t >= vocab_size]
        if outside:
            raise ValueError(f"SamplingParams.stop_token_ids: {outside[0]} is outside the vocabulary [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        """The token is the raw logits' argmax (what a device-side accept and the overlapped decode
        use): temperature 0 and no penalty."""
        return self.temperature == 0.0 and not self.penalized

    @property
    def penalized(self) -> bool:
        """A penalty changes the logits, so every row needs its own prior tokens (engine/sampler.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def as_sampling_params(value: object) -> SamplingParams:
    """SamplingParams as given, a dict of its fields (vLLM users pass those) or None (the defaults);
    anything else, or a dict naming a field SamplingParams lacks, is a ValueError."""
    if value is None:
        return SamplingParams()
    if isinstance(value, SamplingParams):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in dataclasses.fields(SamplingParams)}
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"SamplingParams has no field {unknown[0]!r}; its fields: {', '.join(sorted(names))}")
        return SamplingParams(**value)
    raise ValueError(f"params must be a SamplingParams or a dict of its fields, got {type(value).__name__}")
