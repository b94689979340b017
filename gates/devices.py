"""Which GPU an xdist worker's children use, and how the run record names the device."""

from __future__ import annotations

import platform
import re
import subprocess
from collections.abc import Mapping


def visible_gpu_count() -> int:
    """GPUs `nvidia-smi -L` lists; 0 without a driver. No CUDA context is created."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def worker_gpu(worker_id: str, environ: Mapping[str, str], gpu_count: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES value for xdist worker `gwK`, or None to leave it alone.

    Worker K takes device K modulo the pool: the user's CUDA_VISIBLE_DEVICES list
    when it names several devices, else every GPU. A single pinned device (or an
    empty value, i.e. no GPU) is the user's choice and is kept."""
    m = re.fullmatch(r"gw(\d+)", worker_id)
    if m is None:
        return None
    pinned = environ.get("CUDA_VISIBLE_DEVICES")
    pool = (
        [d.strip() for d in pinned.split(",") if d.strip()]
        if pinned is not None
        else [str(i) for i in range(gpu_count)]
    )
    if len(pool) < 2:
        return None
    return pool[int(m.group(1)) % len(pool)]


def device_name() -> str:
    """The CUDA device the children see first, else `cpu (<arch>)`."""
    try:
        import torch  # imported here: a worker needs no torch, and the controller only at the end
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine() or 'unknown'})"
