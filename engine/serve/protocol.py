"""OpenAI request bodies -> prompts and SamplingParams; a bad field is a BadRequest naming it.
Every field is either used or refused (engine/serve/fields.py); every text is checked to be valid
Unicode before anything is admitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import MAX_LOGPROBS, SamplingParams, text_error
from engine.loader import is_int
from engine.prompts import CHAT_ROLES
from engine.serve.errors import BadRequest
from engine.serve.fields import check_fields

__all__ = ["BadRequest", "Parsed", "parse_chat", "parse_completion"]
MAX_STOPS = 4


@dataclass(frozen=True)
class Parsed:
    prompts: list[str | list[int]]
    params: SamplingParams  # stop strings, min_tokens and logprobs included
    n: int
    stream: bool
    include_usage: bool


def _show(value: Any) -> str:
    text = repr(value)  # escapes lone surrogates, so the message is valid text
    return text if len(text) <= 80 else text[:77] + "..."


def _get(body: dict, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise BadRequest(f"'{name}' must be {' or '.join(k.__name__ for k in kinds)}, got {_show(value)}", name)
    return value


def _count(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = _get(body, name, (int,), default)
    if value is not None and (value < low or (high is not None and value > high)):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise BadRequest(f"'{name}' must be {bound}, got {_show(value)}", name)
    return value


def _real(body: dict, name: str, default: float) -> float:
    value = _get(body, name, (int, float), default)
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        raise BadRequest(f"'{name}' must be a finite number, got {_show(value)}", name) from None


def _text(value: str, where: str, param: str) -> str:
    if (why := text_error(value)) is not None:
        raise BadRequest(f"{where} is not valid text: {why}", param)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"'stop' must be a non-empty string or a list of them, got {_show(stop)}", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    return tuple(_text(s, f"stop[{i}]", "stop") for i, s in enumerate(stops))


def _stream_options(body: dict, stream: bool) -> bool:
    """Whether the stream ends with a usage chunk."""
    options = _get(body, "stream_options", (dict,), {})
    if options and not stream:
        raise BadRequest("'stream_options' needs 'stream': true", "stream_options")
    unknown = [k for k in options if k != "include_usage"]
    if unknown:
        raise BadRequest(f"'stream_options' takes only 'include_usage', got {_show(unknown[0])}", "stream_options")
    return _get(options, "include_usage", (bool,), False)


def _common(body: dict, prompts: list[str | list[int]], logprobs: int | None) -> Parsed:
    n = _count(body, "n", 1, 1, 64)
    if _count(body, "best_of", n, n) != n:
        raise BadRequest("'best_of' other than n is not supported", "best_of")
    stream = _get(body, "stream", (bool,), False)
    include_usage = _stream_options(body, stream)
    _get(body, "user", (str,), None)  # an end-user id for the caller's own records: no effect on output
    stop_ids = _get(body, "stop_token_ids", (list,), [])
    kwargs = dict(
        max_tokens=_count(body, "max_tokens", None, 1) or _count(body, "max_completion_tokens", 16, 1),
        temperature=_real(body, "temperature", 1.0),
        top_p=_real(body, "top_p", 1.0),
        top_k=_count(body, "top_k", 0, -1),  # 0 and -1 (vLLM's "off") both turn it off
        seed=_count(body, "seed", None, 0, 2**63 - 1),
        ignore_eos=_get(body, "ignore_eos", (bool,), False),
        stop=_stops(body),
        stop_token_ids=stop_ids,
        min_tokens=_count(body, "min_tokens", 0, 0),
        logprobs=logprobs,
        presence_penalty=_real(body, "presence_penalty", 0.0),
        frequency_penalty=_real(body, "frequency_penalty", 0.0),
        repetition_penalty=_real(body, "repetition_penalty", 1.0),
        min_p=_real(body, "min_p", 0.0),
        skip_special_tokens=_get(body, "skip_special_tokens", (bool,), True),
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", (bool,), False),
    )
    try:
        params = SamplingParams(**kwargs)
    except ValueError as err:
        message = str(err)
        raise BadRequest(message, next((k for k in kwargs if f"SamplingParams.{k}" in message), None)) from None
    return Parsed(prompts, params, n, stream, include_usage)


def parse_completion(body: dict) -> Parsed:
    """/v1/completions: prompt is a string, a list of strings, token ids or a list of token-id lists."""
    check_fields(body, "completions")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt)):
        prompts, many = [prompt], False
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts, many = list(prompt), True
    else:
        raise BadRequest("'prompt' must be a string, a list of strings or (lists of) token ids", "prompt")
    if any(not p for p in prompts):
        raise BadRequest("'prompt' has an empty prompt", "prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            _text(p, f"prompt[{i}]" if many else "prompt", "prompt")
    return _common(body, prompts, _count(body, "logprobs", None, 0, MAX_LOGPROBS))


def _is_ids(p: Any) -> bool:
    return isinstance(p, list) and bool(p) and all(is_int(t) for t in p)


def parse_chat(body: dict, render) -> Parsed:
    """/v1/chat/completions: `render(messages) -> str` applies the chat template."""
    check_fields(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise BadRequest(f"messages[{i}] must be an object whose 'role' is system, user or assistant", "messages")
        extra = [k for k in m if k not in ("role", "content")]
        if extra:
            raise BadRequest(f"messages[{i}] has {_show(extra[0])}, which this server does not implement", "messages")
        content = _text(_content(m.get("content"), i), f"messages[{i}].content", "messages")
        clean.append({"role": m["role"], "content": content})
    wants = _get(body, "logprobs", (bool,), False)
    top = _count(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not wants:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    try:
        prompt = render(clean)
    except BadRequest:
        raise
    except Exception as err:  # a template may refuse an order of turns (jinja's raise_exception)
        raise BadRequest(f"the chat template refused these messages: {_show(str(err))}", "messages") from None
    return _common(body, [prompt], (top or 0) if wants else None)


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and set(p) == {"type", "text"} and p["type"] == "text" and isinstance(p["text"], str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
