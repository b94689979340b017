"""Which GPU an xdist worker's children use, and how the run record names the device."""

from __future__ import annotations

import contextlib
import fcntl
import platform
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

CHILD_BYTES = 20 << 30  # one 4B known child's peak on its card (19.7 GB used, measured on an H100)


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


@contextlib.contextmanager
def slot(lock_dir: Path, key: str, slots: int, poll_s: float = 0.5) -> Iterator[int]:
    """Hold one of `slots` exclusive slots named `key` (flock'd files under lock_dir, freed when the
    holder exits, however it exits); waits while every slot is held. Yields the slot's index."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(slots):
            f = open(lock_dir / f"{key}-{i}.lock", "w")  # noqa: SIM115 (held for the block)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            try:
                yield i
            finally:
                f.close()
            return
        time.sleep(poll_s)


@contextlib.contextmanager
def card_slot(device) -> Iterator[None]:
    """For a 4B known child on a CUDA device: one of the card's slots, as many as its memory budget
    (engine.memory: 90 % less the activation reserve) holds at CHILD_BYTES each, so a many-worker gate
    on a smaller card queues these children instead of failing their KV budgets."""
    import torch

    from engine.memory import ACTIVATION_RESERVE

    props = torch.cuda.get_device_properties(device)
    slots = max(1, int(props.total_memory * 0.9 - ACTIVATION_RESERVE) // CHILD_BYTES)
    key = f"card-{getattr(props, 'uuid', device.index)}"
    with slot(Path(tempfile.gettempdir()) / "pegaspec-slots", key, slots):
        yield
