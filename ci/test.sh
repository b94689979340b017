#!/usr/bin/env bash
# The test suite: weight-free unit tests, Triton kernels under the interpreter (CPU) and the
# end-to-end gates on the shipped tiny fixture pair. A skipped gate is a failure here.
set -euo pipefail
cd "$(dirname "$0")/.."
export PEGAINFER_REQUIRE_SPEC_GATE=1
exec .venv/bin/python -m pytest -n 2 tests gates "$@"
