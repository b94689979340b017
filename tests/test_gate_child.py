"""The gate's child command, how a child is run, the failure report, and the GPU per xdist worker."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gates.cases import CASES
from gates.child import TAIL_LINES, ChildSpec, child_spec, failure_message, run_child
from gates.devices import slot, worker_gpu

CASE = {c.id: c for c in CASES}


def test_child_spec_sets_one_knob_and_removes_the_others():
    base = {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1",
        "PEGAINFER_TEST_MODEL_PATH": "/m",
        "PEGAINFER_SPEC_MAX_BATCH": "8",
        "PEGAINFER_SPEC_HEDGE": "2",
        "PEGAINFER_SPEC_HEDGE_AUTO": "1",
        "PYTEST_ADDOPTS": "-n 4",
        "PYTEST_XDIST_WORKER": "gw1",
        "PEGAINFER_TEST_LOG": "0",
    }
    before = dict(base)
    spec = child_spec(CASE["greedy-MAX_DRAFTS=4"], base, python="/py")
    assert base == before
    assert spec.argv == (
        "/py",
        "-m",
        "pytest",
        "gates/test_lossless.py::test_greedy_matches_plain_greedy",
        "-x",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    assert spec.env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1",
        "PEGAINFER_TEST_MODEL_PATH": "/m",
        "PEGAINFER_SPEC_MAX_DRAFTS": "4",
        "PEGAINFER_TEST_LOG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    assert set(spec.env_removed) == {
        "PEGAINFER_SPEC_MAX_BATCH",
        "PEGAINFER_SPEC_HEDGE",
        "PEGAINFER_SPEC_HEDGE_AUTO",
        "PYTEST_ADDOPTS",
        "PYTEST_XDIST_WORKER",
    }
    assert spec.shell(Path("/repo dir")).startswith("cd '/repo dir' && env -u PEGAINFER_SPEC_MAX_BATCH ")


def _script_spec(code: str) -> ChildSpec:
    return ChildSpec((sys.executable, "-c", textwrap.dedent(code)), dict(os.environ), {"X": "1"}, ())


def test_run_child_combines_streams_and_keeps_the_log(tmp_path):
    spec = _script_spec("""
        import sys
        print("[lossless] out")
        print("[DEBUG] DFlash round err", file=sys.stderr)
        sys.exit(3)
    """)
    run = run_child(spec, tmp_path, 60, tmp_path / "child.log")
    assert run.returncode == 3
    assert run.output.splitlines() == ["[lossless] out", "[DEBUG] DFlash round err"]
    assert (tmp_path / "child.log").read_text() == run.output


def test_run_child_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    spec = _script_spec(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        print("started", flush=True)
        time.sleep(300)
    """)
    t0 = time.monotonic()
    run = run_child(spec, tmp_path, 3, tmp_path / "child.log")
    assert run.returncode is None and time.monotonic() - t0 < 60
    assert run.output.strip() == "started"
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")


def test_failure_message_names_command_env_exit_code_and_tail(tmp_path):
    case = CASE["greedy-MAX_DRAFTS=2"]
    spec = child_spec(case, {"PATH": "/bin", "PEGAINFER_SPEC_HEDGE": "2"}, python="/py")
    output = "\n".join(f"line {i}" for i in range(100))
    run = SimpleNamespace(
        spec=spec, cwd=tmp_path, returncode=2, timeout_s=1800, output=output, log_path=tmp_path / "child.log"
    )
    msg = failure_message(case, run, ["the child exited 2: boom"])
    assert "  - the child exited 2: boom" in msg
    assert f"child: cd {tmp_path} && env -u PEGAINFER_SPEC_HEDGE PEGAINFER_SPEC_MAX_DRAFTS=2 " in msg
    assert (
        "env set: PEGAINFER_SPEC_MAX_DRAFTS=2 PEGAINFER_TEST_LOG=1 PYTHONUNBUFFERED=1; "
        "removed: PEGAINFER_SPEC_HEDGE" in msg
    )
    assert "exit code: 2" in msg
    assert msg.endswith("\n".join(f"line {i}" for i in range(100 - TAIL_LINES, 100)))
    assert f"line {99 - TAIL_LINES}\n" not in msg


# ---- devices ----


@pytest.mark.parametrize(
    "worker, environ, count, expected",
    [
        ("gw0", {}, 4, "0"),
        ("gw5", {}, 4, "1"),
        ("gw1", {}, 1, None),  # one GPU: nothing to spread
        ("gw1", {}, 0, None),  # no driver
        ("gw1", {"CUDA_VISIBLE_DEVICES": "3"}, 8, None),  # the user pinned one device
        ("gw1", {"CUDA_VISIBLE_DEVICES": ""}, 8, None),  # the user hid every GPU
        ("gw3", {"CUDA_VISIBLE_DEVICES": "4,5, 6"}, 8, "4"),  # the user's pool, not all GPUs
        ("master", {}, 4, None),
    ],
)
def test_worker_gpu(worker, environ, count, expected):
    assert worker_gpu(worker, environ, count) == expected


def test_a_held_slot_queues_the_next_holder_until_it_is_freed(tmp_path):
    """gates.devices.slot: two slots hold two children at once; a third waits for a free one."""
    with slot(tmp_path, "card", 2) as first, slot(tmp_path, "card", 2) as second:
        assert (first, second) == (0, 1)
        got, held = [], threading.Event()
        waiter = threading.Thread(target=lambda: [got.append(i) for i in _hold(tmp_path, held)])
        waiter.start()
        assert not held.wait(0.3) and got == []  # both slots held: the third cannot enter
    waiter.join(timeout=10)
    assert got == [0] and held.is_set()


def _hold(lock_dir, held):
    with slot(lock_dir, "card", 2, poll_s=0.01) as i:
        held.set()
        yield i
