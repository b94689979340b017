#!/usr/bin/env bash
# Create .venv and install pegaspec with its dev and bench extras.
# A torch that python3 can already import (a GPU host's own CUDA build) is reused through
# --system-site-packages and never replaced; otherwise the CPU wheel of torch 2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m venv --system-site-packages .venv
  .venv/bin/python -m pip install -q -e ".[dev,bench,serve]"
else
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c ci/constraints-cpu.txt torch
  .venv/bin/python -m pip install -q -c ci/constraints-cpu.txt -e ".[dev,bench,serve]"
fi
.venv/bin/python -c "import torch, engine, trace_tools; print('pegaspec ready: torch', torch.__version__)"
