"""OpenAI request bodies -> prompts and SamplingParams; a bad field is a BadRequest naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import MAX_LOGPROBS, SamplingParams
from engine.loader import is_int

# Fields the server cannot honour; a request that sets them to a non-default value is refused
# rather than silently served differently.
_UNSUPPORTED = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "echo": False, "suffix": None}
MAX_STOPS = 4


class BadRequest(ValueError):
    """A request the server refuses with HTTP `status` (400 unless said otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass(frozen=True)
class Parsed:
    prompts: list[str | list[int]]
    params: SamplingParams  # stop strings, min_tokens and logprobs included
    n: int
    stream: bool
    include_usage: bool


def _get(body: dict, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise BadRequest(f"'{name}' must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}", name)
    return value


def _count(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = _get(body, name, (int,), default)
    if value is not None and (value < low or (high is not None and value > high)):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise BadRequest(f"'{name}' must be {bound}, got {value}", name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"'stop' must be a non-empty string or a list of them, got {stop!r}", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    return tuple(stops)


def _common(body: dict, prompts: list[str | list[int]], logprobs: int | None, max_tokens_field: str) -> Parsed:
    for name, default in _UNSUPPORTED.items():
        if body.get(name, default) not in (default, None):
            raise BadRequest(f"'{name}' is not supported by this server", name)
    n = _count(body, "n", 1, 1, 64)
    if _count(body, "best_of", n, n) != n:
        raise BadRequest("'best_of' other than n is not supported", "best_of")
    temperature = float(_get(body, "temperature", (int, float), 1.0))
    top_k = _count(body, "top_k", 0, -1)
    stream = _get(body, "stream", (bool,), False)
    options = _get(body, "stream_options", (dict,), {})
    if options and not stream:
        raise BadRequest("'stream_options' needs 'stream': true", "stream_options")
    kwargs = dict(
        max_tokens=_count(body, "max_tokens", None, 1) or _count(body, max_tokens_field, 16, 1),
        temperature=temperature,
        top_p=float(_get(body, "top_p", (int, float), 1.0)),
        top_k=max(top_k, 0),  # -1 (vLLM's "off") and 0 both turn it off
        seed=_count(body, "seed", None, 0, 2**63 - 1),
        ignore_eos=_get(body, "ignore_eos", (bool,), False),
        stop=_stops(body),
        min_tokens=_count(body, "min_tokens", 0, 0),
        logprobs=logprobs,
    )
    try:
        params = SamplingParams(**kwargs)
    except ValueError as err:
        raise BadRequest(str(err)) from None
    return Parsed(prompts, params, n, stream, bool(options.get("include_usage")))


def parse_completion(body: dict) -> Parsed:
    """/v1/completions: prompt is a string, a list of strings, token ids or a list of token-id lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts = list(prompt)
    else:
        raise BadRequest("'prompt' must be a string, a list of strings or (lists of) token ids", "prompt")
    if any(not p for p in prompts):
        raise BadRequest("'prompt' has an empty prompt", "prompt")
    return _common(body, prompts, _count(body, "logprobs", None, 0, MAX_LOGPROBS), "max_completion_tokens")


def _is_ids(p: Any) -> bool:
    return isinstance(p, list) and bool(p) and all(is_int(t) for t in p)


def parse_chat(body: dict, render) -> Parsed:
    """/v1/chat/completions: `render(messages) -> str` applies the chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", "messages")
        clean.append({"role": m["role"], "content": _content(m.get("content"), i)})
    wants = _get(body, "logprobs", (bool,), False)
    top = _count(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not wants:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return _common(body, [render(clean)], (top or 0) if wants else None, "max_completion_tokens")


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
