"""Tokenizer loading, EOS ids and prompt encoding for a checkpoint directory."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from engine.loader import is_int
from engine.models.config import Qwen3Config

log = logging.getLogger(__name__)


def load_tokenizer(directory: Path | None):
    if directory is None or not any(
        (directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except Exception as err:  # a checkpoint without a usable tokenizer still serves token ids
        log.warning("%s: tokenizer not loadable (%s); token-id prompts only", directory, err)
        return None


def eos_ids(cfg: Qwen3Config, directory: Path | None, tokenizer) -> tuple[int, ...]:
    ids = set(cfg.eos_token_ids)
    gen = directory / "generation_config.json" if directory else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(int(i) for i in ids))


def encode_prompt(tokenizer, prompt: str | Sequence[int]) -> tuple[list[int], str | None]:
    """Token ids of a prompt, or ([], why) when it cannot be encoded. Token ids must be ints (a float,
    a bool or a string among them is refused, never rounded or parsed)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            return [], "text prompt but the model has no tokenizer; pass token ids"
        return list(tokenizer.encode(prompt, add_special_tokens=False)), None
    # A tensor or array becomes Python scalars (a 0-d one a bare scalar, refused below).
    ids = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if isinstance(ids, (bytes, bytearray, dict)) or not isinstance(ids, Iterable):
        return [], f"prompt must be a string or a sequence of token ids, got {type(prompt).__name__}"
    ids = list(ids)
    for i, t in enumerate(ids):
        if not is_int(t):
            return [], f"prompt token ids must be ints; item {i} is {t!r} ({type(t).__name__})"
    return [int(t) for t in ids], None
