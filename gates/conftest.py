"""Gate-suite wiring: weights, the skip-to-failure switch, one GPU per xdist worker, the run record."""
from __future__ import annotations

import os

import pytest

from gates.devices import visible_gpu_count, worker_gpu
from gates.run_record import RECORD_ENV, RunRecorder

REQUIRE_ENV = "PEGAINFER_REQUIRE_SPEC_GATE"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-record", metavar="PATH", default=None,
        help=f"where the levers gate writes its run record (default: ${RECORD_ENV}, "
             "else docs/benchmarks/records/levers-gate-<device>.md)",
    )


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        config.pluginmanager.register(RunRecorder(config), "pegaspec-run-record")
        return
    # Set before any child starts, so every child of this worker inherits its one GPU.
    gpu = worker_gpu(workerinput["workerid"], os.environ, visible_gpu_count())
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get(REQUIRE_ENV) == "1":
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
