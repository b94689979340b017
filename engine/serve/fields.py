"""Which body fields each endpoint takes. Nothing is silently ignored: a field this server does
not implement is refused naming it, unless it holds its no-op value (e.g. tools [], which clients
send as explicit defaults), and an unknown field is refused too (docs/api.md)."""

from __future__ import annotations

from typing import Any

from engine.serve.errors import BadRequest

_SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids"}
_SAMPLING |= {"stream", "stream_options", "logprobs", "min_tokens", "ignore_eos", "best_of", "user"}
_SAMPLING |= {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"}
_SAMPLING |= {"skip_special_tokens", "include_stop_str_in_output"}
ACCEPTED = {
    "completions": _SAMPLING | {"prompt", "max_completion_tokens"},
    "chat": _SAMPLING | {"messages", "max_completion_tokens", "top_logprobs"},
}

# OpenAI's and vLLM's fields this server does not implement, each with the values that ask for
# nothing (None always does).
NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "store": (False,),
    "metadata": ({},),
    "service_tier": ("auto", "default"),
    "prompt_logprobs": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
    "use_beam_search": (False,),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "truncate_prompt_tokens": (),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
}


def _kind(value: Any) -> type:
    return float if type(value) is int else type(value)  # 0 and 0.0 alike; True is not 1


def _no_op(value: Any, quiet: tuple[Any, ...]) -> bool:
    return value is None or any(_kind(value) is _kind(q) and value == q for q in quiet)


def check_fields(body: dict, endpoint: str) -> None:
    """BadRequest naming the first field that `endpoint` ("completions" or "chat") does not take."""
    accepted = ACCEPTED[endpoint]
    for name, value in body.items():
        if name in accepted:
            continue
        if name in NOT_IMPLEMENTED:
            if _no_op(value, NOT_IMPLEMENTED[name]):
                continue
            raise BadRequest(f"'{name}' is not implemented by this server; leave it out", name)
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise BadRequest(f"unknown field {shown!r}; this endpoint takes: {', '.join(sorted(accepted))}", name[:60])
