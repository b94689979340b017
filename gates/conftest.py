"""Gate-suite wiring: weights, the skip-to-failure switch, one GPU per xdist worker, the run record."""

from __future__ import annotations

import os

# xdist workers and the children they start share the CPU: one intra-op thread each avoids OpenMP
# oversubscription (tiny-model steps slow down by orders of magnitude under it).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from engine.knobs import read_gate_knobs  # noqa: E402
from gates.devices import visible_gpu_count, worker_gpu  # noqa: E402
from gates.run_record import RECORD_ENV, RECORDS_DIR, RunRecorder  # noqa: E402

REQUIRE_ENV = "PEGAINFER_REQUIRE_SPEC_GATE"
_REQUIRE = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-record",
        metavar="PATH",
        default=None,
        help=f"where the levers gate writes its run record (default: ${RECORD_ENV}, else "
        f"{RECORDS_DIR}/<UTC time>-<commit>.md under the working directory); a run that skipped a case "
        "never writes under docs/",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_REQUIRE] = read_gate_knobs().require_gate  # a malformed value stops the session here
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        config.pluginmanager.register(RunRecorder(config), "pegaspec-run-record")
        return
    # Set before any child starts, so every child of this worker inherits its one GPU.
    gpu = worker_gpu(workerinput["workerid"], os.environ, visible_gpu_count())
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A lossless test that a default-levers gate case of this session runs as its child anyway is not
    run a second time in this process (the same test, the same levers: only CPU time)."""
    from gates.cases import CHILD_MODULE

    cases = [getattr(i, "callspec", None) and i.callspec.params.get("case") for i in items]
    as_child = {c.child for c in cases if c is not None and not c.env and c.module is None}
    twice = [i for i in items if i.nodeid.startswith(CHILD_MODULE + "::") and i.name in as_child]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [i for i in items if i not in twice]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.config.stash[_REQUIRE]:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_ENV}=1 turns this skip into a failure: {reason}"
    return report


@pytest.fixture(scope="session")
def gate_weights():
    """The target + drafter pair every gate runs on; skips with the reason when there is none."""
    from gates.weights import resolve_gate_weights  # imports engine; only when a gate runs

    weights, reason = resolve_gate_weights()
    if weights is None:
        pytest.skip(reason)
    return weights
