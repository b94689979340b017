"""Disconnect-aware waiting and a server-sent-events response: a client that goes away cancels the
work it was waiting on, so its requests can be aborted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class Disconnected(Exception):
    """The client closed its connection while the server was still working for it."""


async def _watch(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """`work`'s result, or Disconnected (with `work` cancelled) once the client goes away."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_watch(receive))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
    if task in done:
        return task.result()
    await asyncio.gather(task, return_exceptions=True)
    raise Disconnected


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class EventStream:
    """An ASGI response streaming `events` as text/event-stream. A disconnect cancels the iteration
    (its `finally` runs), rather than waiting for the next failed send to notice."""

    def __init__(self, events: AsyncIterator[bytes]):
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def pump() -> None:
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnect(pump(), receive)
        except Disconnected:
            pass
        finally:
            await self.events.aclose()
