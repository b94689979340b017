"""generate() and chat() inputs: one prompt per request with its SamplingParams, checked before
any request is admitted."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from engine.config import SEED_MAX, SamplingParams, as_sampling_params
from engine.loader import is_int
from engine.outputs import RequestOutput

CHAT_ROLES = ("system", "user", "assistant")


def batch(prompts: object, params: object) -> tuple[list[object], list[SamplingParams]]:
    """(prompts, one SamplingParams each). A single prompt (a string, a token-id list or a vLLM-style
    dict) is a batch of one; params is one SamplingParams (or dict of its fields, or None) for every
    prompt, or a sequence with one per prompt. A ValueError here admits nothing."""
    if isinstance(prompts, (str, Mapping)) or (isinstance(prompts, Sequence) and len(prompts) and is_int(prompts[0])):
        prompts = [prompts]
    if not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a prompt or a sequence of prompts, got {type(prompts).__name__}")
    prompts = list(prompts)
    if params is None or isinstance(params, (SamplingParams, Mapping)):
        return prompts, [as_sampling_params(params)] * len(prompts)
    if isinstance(params, str) or not isinstance(params, Sequence):
        raise ValueError(f"params must be a SamplingParams, a dict of its fields or a list of them, got {params!r}")
    if len(params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    return prompts, [as_sampling_params(p) for p in params]


def conversations(messages: object) -> list[list[dict[str, str]]]:
    """One conversation (a list of {"role", "content"} dicts) or a list of them, as vLLM's LLM.chat
    takes; roles are system, user and assistant, contents strings."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts, or a list of such lists")
    many = not isinstance(messages[0], Mapping)
    out = []
    for c, conversation in enumerate(messages if many else [messages]):
        where = f"conversation {c}" if many else "messages"
        if not isinstance(conversation, Sequence) or isinstance(conversation, str) or not conversation:
            raise ValueError(f"{where} must be a non-empty list of {{'role', 'content'}} dicts")
        for i, m in enumerate(conversation):
            if not isinstance(m, Mapping) or set(m) != {"role", "content"}:
                raise ValueError(f"{where}[{i}] must be a dict with exactly 'role' and 'content', got {m!r}")
            if m["role"] not in CHAT_ROLES or not isinstance(m["content"], str):
                raise ValueError(f"{where}[{i}]: role must be one of {CHAT_ROLES} and content a string, got {m!r}")
        out.append([dict(m) for m in conversation])
    return out


def completions(params: SamplingParams) -> list[SamplingParams]:
    """The engine requests of one prompt: n of them, each with n=1; with a seed, completion c is
    seeded seed + c (n seeded completions must differ), else each takes its own derived seed."""
    if params.n == 1:
        return [params]
    seeds = [None if params.seed is None else (params.seed + c) % (SEED_MAX + 1) for c in range(params.n)]
    return [dataclasses.replace(params, n=1, seed=seed) for seed in seeds]


def merged(outputs: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput of a request's completions: `outputs` lists them (index c), the flat fields are
    the first one's; finished once all are."""
    each = [dataclasses.replace(o.outputs[0], index=c) for c, o in enumerate(outputs)]
    return dataclasses.replace(outputs[0], outputs=each, finished=all(o.finished for o in outputs))
