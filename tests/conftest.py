"""Shared fixtures: random tiny checkpoints, built once per session."""

from __future__ import annotations

import os

# xdist workers (and the gate children they start) share a small CPU: one intra-op thread each
# avoids OpenMP oversubscription, which slows tiny-model steps by orders of magnitude.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.checkpoints import make_drafter, make_target  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """Tiny-model steps on a small shared CPU: one intra-op thread avoids OpenMP oversubscription
    (seconds instead of a minute); restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    make_target(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_drafter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drafter")
    make_drafter(directory)
    return directory


@pytest.fixture(scope="session")
def shipped_tiny():
    """The shipped tiny pair (target, drafter) directories."""
    from engine.shipped import shipped_pair

    return shipped_pair("tiny")


@pytest.fixture(scope="session")
def shipped_prompt_ids(shipped_tiny):
    """Token ids of the shipped tiny pair's held-out prompts, in file order."""
    import json

    from engine import Engine, EngineConfig
    from engine.shipped import shipped_prompts

    engine = Engine(EngineConfig(model=str(shipped_tiny[0]), device="cpu"))
    lines = shipped_prompts("tiny").read_text().splitlines()
    return [engine.tokenizer.encode(json.loads(line)["text"], add_special_tokens=False) for line in lines]


@pytest.fixture(autouse=True)
def _clean_knobs(monkeypatch):
    """Tests start from an environment without PEGAINFER_* levers (CI may export some)."""
    for name in list(os.environ):
        if name.startswith("PEGAINFER_SPEC_") or name == "PEGAINFER_TEST_LOG":
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def live(one_thread):
    """The shipped tiny pair behind the HTTP server on a free loopback port, for one module."""
    from tests.serve_helpers import live_server

    with live_server(max_num_seqs=8) as server:
        yield server


@pytest.fixture(scope="module")
def http(live):
    """An HTTP client of `live`'s /v1 API."""
    import httpx

    with httpx.Client(base_url=live.base_url, timeout=120) as client:
        yield client
