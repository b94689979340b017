"""Lazy triton binding for the kernel modules.

Kernels sit beside their torch references, but `import engine` must work without triton, and
whether a kernel is compiled or interpreted (`TRITON_INTERPRET=1`) is decided when triton
decorates it. So `@jit` only records the function; the first launch of any kernel of a module
imports triton, binds `tl` in that module, and swaps every recorded kernel for the real
`triton.jit` object (after that, launches go straight to triton). Kernel modules use
`from __future__ import annotations` so `tl.constexpr` annotations stay unevaluated until then.
Under the interpreter, `bind` also patches two triton 3.6 interpreter problems (see the fixups).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from typing import Any

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
_lock = threading.RLock()  # bind recurses into the modules of imported helpers


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


# Programmatic dependent launch (sm90+): a kernel launched with it may start while the previous one
# drains; it waits (griddepcontrol.wait) before touching the previous kernel's output, then lets the
# next one launch. The kernels that take a PDL constexpr do both first thing, except the GEMV
# (gemv.py), which issues its first weight tile before the wait.
# Launches of more token rows than this go without PDL (None: every launch with it). Above the H200
# table's 64 rows the projections are cuBLAS's, and a PDL kernel after one ran a verify of 16 x 16 rows
# 1.017x slower (decode_ab at 0b7fa47, 4B geometry; 64 x 4: 1.001, c=64 with its prefill: 1.008).
PDL_MAX_ROWS: int | None = 64


@functools.lru_cache(maxsize=8)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def sm90(device: torch.device) -> bool:
    """Whether the device is a CUDA GPU of compute capability 9.0 or above (PDL, TMA)."""
    if device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


def pdl(device: torch.device, rows: int = 0) -> dict:
    """Launch options of the PDL-aware kernels: {"PDL": True, "launch_pdl": True} on an sm90+ GPU
    with PDL on for a launch over `rows` token rows, else {"PDL": False} (the interpreter runs no
    griddepcontrol)."""
    on = PDL_MAX_ROWS is None or rows <= PDL_MAX_ROWS
    on = on and device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1" and sm90(device)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("the triton backend needs the `triton` package (pip install triton)")


class LazyKernel:
    """A kernel declared with `@jit`, turned into a triton kernel at its first launch."""

    def __init__(self, fn, options: dict[str, Any]):
        self.fn, self.options = fn, options

    def __getitem__(self, grid):
        return bind(self.fn.__globals__)[self.fn.__name__][grid]

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.fn.__name__} is a triton kernel: launch it as kernel[grid](...)")


def jit(fn=None, **options):
    """`triton.jit`, deferred to the first launch (see the module docstring)."""
    if fn is None:
        return lambda f: LazyKernel(f, options)
    return LazyKernel(fn, options)


def bind(module_globals: dict) -> dict:
    """Import triton and swap every LazyKernel of the module at once (kernels call helpers by name)."""
    require_triton()
    with _lock:
        if module_globals.get("tl") is None:
            import triton
            import triton.language as tl

            _interpreter_fixups()
            for name, value in list(module_globals.items()):
                if isinstance(value, LazyKernel):
                    if value.fn.__globals__ is not module_globals:  # a helper imported from another module
                        bind(value.fn.__globals__)  # resolves `tl` in its own module's globals
                    module_globals[name] = triton.jit(value.fn, **value.options)
            module_globals["tl"] = tl
    return module_globals


def _interpreter_fixups() -> None:
    try:
        from triton import knobs
    except ImportError:  # triton < 3.4: neither fix applies
        return
    if knobs.runtime.interpret:
        _fix_interpreter_stdlib()
        _fix_interpreter_index()


def _fix_interpreter_stdlib() -> None:
    """triton picks interpret-or-compile when it decorates a function, its own standard library
    (tl.sum, tl.max, tl.cdiv, ...) included, at `import triton`. If triton was imported before
    TRITON_INTERPRET=1 was set (importing transformers' Qwen3 does that), those are compile-only
    JITFunctions the interpreter cannot call: re-wrap them as the interpreter would have."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("triton.language"):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, wrapped.setdefault(id(value), InterpretedFunction(value.fn)))


def _fix_interpreter_index() -> None:
    """Under TRITON_INTERPRET=1 with numpy >= 2.4, `range(lo, hi)` over loaded scalars fails
    (triton-lang/triton#9171, fixed upstream after 3.6): interpreter scalars are 1-element arrays
    and numpy no longer converts those with int(). Apply the upstream one-line fix."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_pegaspec_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter._pegaspec_index_fix = True
