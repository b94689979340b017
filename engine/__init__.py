"""pegaspec engine: a compact speculative-decoding engine for Qwen3 with DFlash drafters."""

from engine.config import EngineConfig, SamplingParams
from engine.engine import Engine, RequestOutput, SpecStats
from engine.outputs import CompletionOutput, Logprob

__all__ = ["CompletionOutput", "Engine", "EngineConfig", "Logprob", "RequestOutput", "SamplingParams", "SpecStats"]
