"""The Starlette app: OpenAI-compatible completions and chat, /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from engine.request import RequestOutput
from engine.serve import metrics
from engine.serve.asgi import Disconnected, EventStream, sse, until_disconnect
from engine.serve.body import decode_body
from engine.serve.protocol import BadRequest, Parsed, parse_chat, parse_completion
from engine.serve.text import Choice, chat_logprobs, completion_logprobs
from engine.serve.worker import EngineWorker, Ticket
from engine.tokenizing import chat_unavailable, render_chat

log = logging.getLogger(__name__)
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: an error naming a client's field or text stays encodable whatever it holds."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "server_error")
    return AsciiJSON({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)


@dataclasses.dataclass
class Job:
    """One HTTP request: n choices per prompt, each an engine request."""

    kind: str  # "text_completion" or "chat.completion"
    parsed: Parsed
    model: str
    tickets: list[Ticket]
    choices: list[Choice]
    outputs: asyncio.Queue
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        suffix = ".chunk" if self.kind == "chat.completion" and self.parsed.stream else ""
        prefix = "chatcmpl-" if self.kind == "chat.completion" else "cmpl-"
        body = dict(id=prefix + self.id, object=self.kind + suffix, created=self.created, model=self.model)
        body["choices"] = choices
        if usage is not None:
            body["usage"] = usage
        return body

    def choice(self, c: Choice, text: str, finished: bool, tokenizer) -> dict:
        reason = _FINISH.get(c.out.finish_reason) if finished else None
        offset = c.sent - len(text)
        entries = c.new_logprobs()
        logprobs = None
        if self.parsed.params.logprobs is not None:
            chat = self.kind == "chat.completion"
            logprobs = chat_logprobs(entries, tokenizer) if chat else completion_logprobs(entries, tokenizer, offset)
        if self.kind == "chat.completion":
            key = "delta" if self.parsed.stream else "message"
            return {
                "index": c.index,
                key: {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": reason,
            }
        return {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def usage(self) -> dict:
        prompt = sum(len(c.out.prompt_token_ids) for c in self.choices[:: self.parsed.n])
        completion = sum(len(c.out.token_ids) for c in self.choices)
        return dict(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def build_app(worker: EngineWorker, model_name: str) -> Starlette:
    engine = worker.engine
    chat_refused = chat_unavailable(engine.tokenizer)

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok") if worker.alive else PlainTextResponse("engine loop stopped", 503)

    async def models(_: Request) -> Response:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "pegaspec"}
        return JSONResponse({"object": "list", "data": [card]})

    async def show_metrics(_: Request) -> Response:
        return Response(metrics.render(worker.counters, worker.snapshot), media_type=metrics.CONTENT_TYPE)

    async def completions(request: Request) -> Response:
        return await _handle(request, "text_completion", parse_completion)

    async def chat(request: Request) -> Response:
        if chat_refused is not None:
            return error(chat_refused, 400)
        return await _handle(
            request, "chat.completion", lambda body: parse_chat(body, partial(render_chat, engine.tokenizer))
        )

    async def _handle(request: Request, kind: str, parse) -> Response:
        try:
            body = decode_body(await request.body())
            if body.get("model") not in (None, model_name):
                raise BadRequest(
                    f"model {str(body['model'])[:80]!r} does not exist; this server serves {model_name!r}", "model", 404
                )
            parsed = parse(body)
            if engine.tokenizer is None and any(isinstance(p, str) for p in parsed.prompts):
                raise BadRequest("this model has no tokenizer; send token-id prompts", "prompt")
            if engine.tokenizer is None and (parsed.params.logprobs is not None or parsed.params.stop):
                raise BadRequest("logprobs and stop strings need a tokenizer; this model has none")
        except BadRequest as err:
            return error(str(err), err.status, err.param)
        job = _submit(kind, parsed)
        try:
            first, backlog = await until_disconnect(_first_outputs(job), request.receive)
        except Disconnected:
            _abort(job)
            return Response(status_code=499)
        failed = next((o for o in first if o.finish_reason in ("rejected", "error")), None)
        if failed is not None:
            _abort(job)
            return error(failed.error or "request failed", 400 if failed.finish_reason == "rejected" else 500)
        if parsed.stream:
            return EventStream(_events(job, backlog))
        try:
            await until_disconnect(_finish(job, backlog), request.receive)
        except Disconnected:
            _abort(job)
            return Response(status_code=499)
        body = job.chunk([job.choice(c, c.out.text, True, engine.tokenizer) for c in job.choices], job.usage())
        return JSONResponse(body)

    def _submit(kind: str, parsed: Parsed) -> Job:
        outputs: asyncio.Queue = asyncio.Queue()
        tickets, choices = [], []
        for prompt in parsed.prompts:
            for i in range(parsed.n):
                params = parsed.params
                if parsed.n > 1 and params.seed is not None:  # n seeded choices must differ
                    params = dataclasses.replace(params, seed=params.seed + i)
                tickets.append(worker.submit(prompt, params, outputs))
                choices.append(Choice(len(choices), engine.tokenizer, parsed.params, parsed.stream))
        return Job(kind, parsed, model_name, tickets, choices, outputs)

    async def _first_outputs(job: Job) -> tuple[list[RequestOutput], list[tuple[Ticket, RequestOutput]]]:
        """The first output of every choice (the engine admitted or rejected each), and every output
        taken so far in the order to apply them: the first ones by choice, then the later ones."""
        first: dict[Ticket, RequestOutput] = {}
        later: list[tuple[Ticket, RequestOutput]] = []
        while len(first) < len(job.tickets):
            ticket, out = await job.outputs.get()
            if ticket in first:
                later.append((ticket, out))
            else:
                first[ticket] = out
        outs = [first[t] for t in job.tickets]
        return outs, [*zip(job.tickets, outs, strict=True), *later]

    async def _updates(job: Job, backlog: list) -> AsyncIterator[tuple[Choice, str, RequestOutput]]:
        """Each output of the job's choices (the backlog first) with the text it adds, until all finished."""
        live = len(job.choices)
        while live:
            ticket, out = backlog.pop(0) if backlog else await job.outputs.get()
            c = job.choices[job.tickets.index(ticket)]
            live -= out.finished
            yield c, c.update(out), out

    async def _finish(job: Job, backlog: list) -> None:
        async for _ in _updates(job, backlog):
            pass

    async def _events(job: Job, backlog: list) -> AsyncIterator[bytes]:
        try:
            if job.kind == "chat.completion":
                role = [{"index": c.index, "delta": {"role": "assistant", "content": ""}} for c in job.choices]
                yield sse(job.chunk(role))
            async for c, text, out in _updates(job, backlog):
                if text or out.finished or (out.logprobs or [])[c.scored :]:
                    yield sse(job.chunk([job.choice(c, text, out.finished, engine.tokenizer)]))
            if job.parsed.include_usage:
                yield sse(job.chunk([], job.usage()))
            yield sse("[DONE]")
        finally:
            _abort(job)  # no-op for finished requests; a client gone mid-stream frees its KV here

    def _abort(job: Job) -> None:
        for ticket, c in zip(job.tickets, job.choices, strict=True):
            if c.out is None or not c.out.finished:
                worker.abort(ticket)

    routes = [
        Route("/health", health),
        Route("/metrics", show_metrics),
        Route("/v1/models", models),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    return Starlette(routes=routes)
