#!/usr/bin/env bash
# Create .venv and install pegaspec with its dev, bench and serve extras.
#
# - python3 (or $PYTHON) can import torch (a GPU host's own CUDA build): the venv sees that
#   interpreter's packages and never replaces them. When every dependency is already importable,
#   pegaspec installs without build isolation, without dependencies and without an index: no network.
#   Otherwise pip fetches what is missing (torch is reused); if that fails (no network), pegaspec
#   still installs offline and the line below names the optional packages left out.
# - No torch: the CPU wheel of torch 2.13.0 and the pinned versions (CI, laptops; needs network).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CORE="torch transformers safetensors huggingface_hub tokenizers filelock numpy pytest xdist setuptools"
EXTRAS="triton ruff openai httpx hypothesis matplotlib tqdm starlette uvicorn"
missing() {  # the names in $@ that .venv/bin/python cannot import (setuptools: too old for an offline editable build)
  .venv/bin/python - "$@" <<'PY'
import importlib.util, sys
def ok(name):
    if importlib.util.find_spec(name) is None:
        return False
    if name != "setuptools":
        return True
    import setuptools
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return version >= (77,)  # the SPDX license field
print(" ".join(m for m in sys.argv[1:] if not ok(m)))
PY
}
if "$PY" -c "import torch" 2>/dev/null; then
  # Without its own pip and setuptools when the host has them: the venv's bundled (older) copies
  # would shadow the host's and force a download.
  if "$PY" -c "import pip" 2>/dev/null; then "$PY" -m venv --without-pip .venv; else "$PY" -m venv .venv; fi
  # The host interpreter's site directories (system, conda or a virtualenv), .pth files included;
  # they come after the venv's own, so whatever the venv installs wins.
  host_sites=$("$PY" -c 'import site; print(repr(site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])))')
  venv_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; list(map(site.addsitedir, $host_sites))" > "$venv_site/_pegaspec_host.pth"
  offline=(--no-build-isolation --no-deps --no-index -e .)
  if [ -z "$(missing $CORE $EXTRAS)" ]; then
    echo "every dependency is importable: installing pegaspec offline (no build isolation, no index)"
    .venv/bin/python -m pip install -q "${offline[@]}"
  elif [ -z "$(missing $CORE)" ]; then
    if ! .venv/bin/python -m pip install -q --no-build-isolation -e ".[dev,bench,serve]"; then
      echo "pip could not fetch the optional packages (offline?); installing pegaspec without them" >&2
      .venv/bin/python -m pip install -q "${offline[@]}"
    fi
  else
    .venv/bin/python -m pip install -q -e ".[dev,bench,serve]"
  fi
  left=$(missing $CORE $EXTRAS)
  [ -z "$left" ] || echo "note: not importable, so their parts are skipped or unavailable: $left" >&2
else
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c ci/constraints-cpu.txt torch
  .venv/bin/python -m pip install -q -c ci/constraints-cpu.txt -e ".[dev,bench,serve]"
fi
.venv/bin/python -c "import torch, engine, trace_tools; print('pegaspec ready: torch', torch.__version__)"
