"""Checkpoint resolution (local directory or hub cache) and safetensors loading."""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import torch


def is_int(value: object) -> bool:
    """An integer (a NumPy one too), not a bool: every int field's and token id's check."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or does not fit what loads it."""


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A local HF-layout directory, else a hub repo id resolved from the local cache
    (the network is tried only when HF_HUB_OFFLINE is not set)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} is a file; expected a directory with config.json")
    name = str(name_or_path)
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        raise CheckpointError(f"checkpoint {name!r}: no such directory, and not a hub repo id (owner/name)")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"]
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception as cached_err:
        if offline:
            raise CheckpointError(
                f"checkpoint {name!r} is not in the hub cache and HF_HUB_OFFLINE=1 forbids a download"
            ) from cached_err
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as err:
        raise CheckpointError(f"checkpoint {name!r}: not found locally and the hub download failed: {err}") from err


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: missing config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from err


def safetensors_files(directory: Path) -> list[Path]:
    """The shard list from model.safetensors.index.json, else the single model.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: not a safetensors index ({err})") from err
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that do not exist: {', '.join(missing)}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(f"{directory}: no model.safetensors, no index, no *.safetensors")


def load_tensors(directory: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(directory):
        try:
            tensors.update(load_file(str(file), device=str(device)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{file}: cannot read safetensors ({err})") from err
    return tensors


# Weights the engine casts to its compute dtype; anything else (int8, fp8, bool) is stored quantized
# or is not a weight, and a plain cast would serve garbage.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def take(
    tensors: dict[str, torch.Tensor],
    name: str,
    shape: tuple[int, ...],
    where: Path | str,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Pop one named weight, check its shape and dtype, move it (contiguous) to device/dtype when given,
    and check it is finite there (a cast to float16 can overflow); errors name the checkpoint and tensor."""
    if name not in tensors:
        raise CheckpointError(f"{where}: missing tensor {name!r}")
    t = tensors.pop(name)
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise CheckpointError(
            f"{where}: tensor {name!r} has dtype {str(t.dtype).removeprefix('torch.')}; the engine loads "
            "unquantized floating-point weights (float16, bfloat16, float32)"
        )
    if device is not None or dtype is not None:
        t = t.to(device=device, dtype=dtype).contiguous()
    # One reduction per tensor, on the device: a NaN or an Inf makes the fp32 sum non-finite, so a
    # finite sum proves every element finite; only a non-finite sum pays the exact count.
    if not torch.isfinite(t.sum(dtype=torch.float32)):
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            dtype_name = str(t.dtype).removeprefix("torch.")
            raise CheckpointError(f"{where}: tensor {name!r} has {bad} non-finite values (NaN or Inf) in {dtype_name}")
    return t


@dataclass
class Checkpoint:
    """A resolved checkpoint: its config.json and its tensors, from a directory or already in memory
    (benchmarks build random weights on the device without writing them out)."""

    name: str
    config: dict
    directory: Path | None = None
    tensors: dict[str, torch.Tensor] | None = None

    def load_tensors(self) -> dict[str, torch.Tensor]:
        if self.tensors is not None:
            return dict(self.tensors)
        return load_tensors(self.directory)


def open_checkpoint(source: str | os.PathLike | Checkpoint) -> Checkpoint:
    if isinstance(source, Checkpoint):
        return source
    directory = resolve_checkpoint(source)
    return Checkpoint(name=str(directory), config=read_config(directory), directory=directory)
