"""What step() and generate() return: the flat fields and, beside them, vLLM's shapes
(`RequestOutput.outputs`, a list of `CompletionOutput`; `Logprob` per position; docs/api.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Logprob:
    """vLLM's per-token entry: log-probability under the target's raw distribution, 1-based rank
    in it, and the token's own text (None without a tokenizer)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request, as vLLM's: `logprobs` holds one {token id: Logprob} per output
    token (the chosen one and the top k) when SamplingParams.logprobs is set, else None;
    `cumulative_logprob` their sum over the chosen tokens (None likewise). `stop_reason` is the
    stop string or stop token id that ended it (None for EOS, the budget or still running)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    error: str | None = None
    text: str = ""  # the decoded output so far (with a tokenizer), as vLLM's step(); see Request._text
    logprobs: list | None = None  # TokenLogprob per output token when SamplingParams.logprobs is set
    prompt: str | None = None  # the prompt's text (None for a token-id prompt), as vLLM's
    outputs: list[CompletionOutput] = field(default_factory=list)  # vLLM's shape: one per completion
    prompt_logprobs: list | None = None  # vLLM's; None: prompt log-probabilities are not computed
    num_cached_tokens: int = 0  # vLLM's prefix-cache hits; this engine has no prefix cache
