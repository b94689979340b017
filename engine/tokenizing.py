"""Tokenizer loading, EOS ids and prompt encoding for a checkpoint directory."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from engine.config import text_error
from engine.loader import is_int
from engine.models.config import Qwen3Config

log = logging.getLogger(__name__)


def load_tokenizer(directory: Path | None):
    names = ("tokenizer.json", "tokenizer_config.json")
    if directory is None or not any((directory / name).is_file() for name in names):
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


_PROMPT_KEYS = {"prompt", "prompt_token_ids"}  # vLLM's TextPrompt / TokensPrompt


def prompt_parts(prompt: object, label: str = "prompt") -> tuple[str | Sequence[int] | None, str | None]:
    """(the text or token ids, why not): a vLLM-style dict prompt ({"prompt": text} or
    {"prompt_token_ids": ids}) is unwrapped; other prompts pass through as they are."""
    if not isinstance(prompt, Mapping):
        return prompt, None  # type: ignore[return-value]
    extra = sorted(str(k) for k in prompt if k not in _PROMPT_KEYS)
    if extra:
        keys = "{'prompt': text} or {'prompt_token_ids': ids}"
        return None, f"{label} has key {extra[0]!r}, which this engine does not take; it takes {keys}"
    if len(prompt) != 1:
        return None, f"{label} must have exactly one of 'prompt' and 'prompt_token_ids'"
    ((key, value),) = prompt.items()
    if key == "prompt" and not isinstance(value, str):
        return None, f"{label}['prompt'] must be a string, got {type(value).__name__}"
    if key == "prompt_token_ids" and isinstance(value, str):
        return None, f"{label}['prompt_token_ids'] must be token ids, got a string"
    return value, None


def encode_prompt(
    tokenizer, prompt: str | Sequence[int] | Mapping, label: str = "prompt"
) -> tuple[list[int], str | None]:
    """Token ids of a prompt, or ([], why) when it cannot be encoded; `label` names it in `why` (e.g.
    "prompt 3" in a batch). Text must be valid Unicode (text_error); token ids must be ints (a float,
    a bool or a string among them is refused, never rounded or parsed)."""
    prompt, why = prompt_parts(prompt, label)
    if why is not None:
        return [], why
    if isinstance(prompt, str):
        if tokenizer is None:
            return [], "text prompt but the model has no tokenizer; pass token ids"
        if (bad := text_error(prompt)) is not None:
            return [], f"{label} is not valid text: {bad}"
        try:
            return list(tokenizer.encode(prompt, add_special_tokens=False)), None
        except Exception as err:  # a tokenizer's refusal is this prompt's rejection, not the batch's failure
            return [], f"{label} could not be tokenized: {type(err).__name__}: {err}"
    # A tensor or array becomes Python scalars (a 0-d one a bare scalar, refused below).
    ids = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if isinstance(ids, (bytes, bytearray, dict)) or not isinstance(ids, Iterable):
        return [], f"prompt must be a string or a sequence of token ids, got {type(prompt).__name__}"
    ids = list(ids)
    for i, t in enumerate(ids):
        if not is_int(t):
            return [], f"prompt token ids must be ints; item {i} is {t!r} ({type(t).__name__})"
    return [int(t) for t in ids], None


def chat_unavailable(tokenizer) -> str | None:
    """Why this tokenizer cannot render chat (none, or no chat template of its own; docs/api.md); None if it can."""
    if tokenizer is None:
        return "chat needs a tokenizer; this model has none (send token-id prompts to completions)"
    if not getattr(tokenizer, "chat_template", None):
        return "this model's tokenizer has no chat template, so it cannot chat; use completions"
    return None


def render_chat(tokenizer, messages: Sequence[Mapping[str, str]]) -> str:
    """A conversation as prompt text through the tokenizer's own chat template, generation prompt
    added; ValueError (chat_unavailable's message) where it has none."""
    if (why := chat_unavailable(tokenizer)) is not None:
        raise ValueError(why)
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
