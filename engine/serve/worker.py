"""The engine loop in its own thread: submissions and aborts arrive through a queue, outputs go back
to each request's asyncio queue on the server's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import SamplingParams
from engine.request import RequestOutput

log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.5  # how long an idle loop blocks on its inbox before checking for shutdown


@dataclass(eq=False)
class Ticket:
    """One engine request as the server sees it: (ticket, output) pairs arrive on `outputs`, a queue
    of the server's event loop that the choices of one HTTP request share."""

    prompt: str | Sequence[int]
    params: SamplingParams
    outputs: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    request_id: str | None = None  # set by the engine thread once added

    def deliver(self, out: RequestOutput) -> None:
        self.loop.call_soon_threadsafe(self.outputs.put_nowait, (self, out))


@dataclass
class Counters:
    """Server-side totals the metrics endpoint shows next to the engine's own stats."""

    requests: int = 0
    aborted: int = 0
    rejected: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0


class EngineWorker:
    def __init__(self, engine):
        self.engine = engine
        self.counters = Counters()
        self.snapshot: dict[str, float] = {}  # replaced whole after every step: readers never see it half-built
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, Ticket] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # -- server side (event-loop thread) -------------------------------------------------------------
    def start(self) -> None:
        self._snapshot()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: str | Sequence[int], params: SamplingParams, outputs: asyncio.Queue) -> Ticket:
        """Queue a request for the engine thread; call from the event loop."""
        ticket = Ticket(prompt, params, outputs, asyncio.get_running_loop())
        self._inbox.put(("add", ticket))
        return ticket

    def abort(self, ticket: Ticket) -> None:
        self._inbox.put(("abort", ticket))

    # -- engine thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # one failed step must not take the server down: fail what was in flight
                log.exception("engine step failed; finishing every request in flight with an error")
                self._fail_all()
                continue
            self.counters.steps += 1
            for out in outputs:
                self._route(out)
            self._snapshot()

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            verb, ticket = item
            if verb == "add":
                self._add(ticket)
            elif ticket.request_id in self._live:
                self.engine.abort(ticket.request_id)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, ticket: Ticket) -> None:
        self.counters.requests += 1
        try:
            ticket.request_id = self.engine.add_request(ticket.prompt, ticket.params)
        except Exception as err:  # the engine refuses by rejecting; anything else is a bug, reported per request
            log.exception("add_request failed")
            self.counters.errors += 1
            ticket.deliver(RequestOutput("", [], [], [], True, "error", f"the engine could not add it: {err}"))
            return
        self._live[ticket.request_id] = ticket

    def _route(self, out: RequestOutput) -> None:
        ticket = self._live.get(out.request_id)
        if ticket is None:
            return
        if out.finished:
            del self._live[out.request_id]
            c = self.counters
            if out.finish_reason == "rejected":
                c.rejected += 1
            else:
                c.prompt_tokens += len(out.prompt_token_ids)
                c.completion_tokens += len(out.token_ids)
                c.aborted += out.finish_reason == "abort"
        ticket.deliver(out)

    def _fail_all(self) -> None:
        for request_id, ticket in list(self._live.items()):
            self.engine.abort(request_id)
            self.counters.errors += 1
            ticket.deliver(RequestOutput(request_id, [], [], [], True, "error", "the engine step failed"))
        self._live.clear()
        try:
            self.engine.step()  # reports (and releases) the aborted requests
        except Exception:
            log.exception("engine step after a failure failed too")

    def _snapshot(self) -> None:
        e = self.engine
        snap = {f"stats_{k}": v for k, v in dataclasses.asdict(e.stats).items() if isinstance(v, (int, float))}
        snap.update(
            tau=e.stats.tokens_per_round,
            preemptions=e.preemptions,
            launched_ahead=e.rounds.overlap.launches,
            launched_ahead_used=e.rounds.overlap.used,
            running=len(e.scheduler.running),
            waiting=len(e.scheduler.waiting),
            kv_blocks_total=e.blocks.capacity,
            kv_blocks_free=e.blocks.num_free,
        )
        snap.update({f"lever_{k}": v for k, v in dataclasses.asdict(e.levers).items() if isinstance(v, (int, bool))})
        self.snapshot = snap
