"""A live server for the API tests: the shipped tiny pair on CPU behind uvicorn on a free loopback port."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from engine import Engine, EngineConfig
from engine.serve.app import build_app
from engine.serve.worker import EngineWorker
from engine.shipped import shipped_pair

MODEL = "tiny"
_START_LIMIT_S = 60.0


@dataclass
class LiveServer:
    url: str
    worker: EngineWorker

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@contextmanager
def live_server(**config):
    target, drafter = shipped_pair("tiny")
    with serving(Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", **config))) as live:
        yield live


@contextmanager
def serving(engine: Engine, model: str = MODEL):
    """`engine` behind the app on a free loopback port, its loop thread and uvicorn started and stopped."""
    worker = EngineWorker(engine)
    worker.start()
    server = uvicorn.Server(uvicorn.Config(build_app(worker, model), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_LIMIT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", worker)
    finally:
        server.should_exit = True
        thread.join()
        worker.stop()


def wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    """Poll until predicate() holds; a bound on waiting, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)
