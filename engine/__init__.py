"""pegaspec engine: a compact speculative-decoding engine for Qwen3 with DFlash drafters."""

from engine.config import EngineConfig, SamplingParams
from engine.engine import Engine, RequestOutput, SpecStats

__all__ = ["Engine", "EngineConfig", "RequestOutput", "SamplingParams", "SpecStats"]
