"""Tuned kernel configs as data, one JSON file per device: engine/kernels/tuned/<device-slug>.json.

The slug is `torch.cuda.get_device_name()` lower-cased with every run of other characters turned
into `-` ("NVIDIA H200" -> nvidia-h200). A device's file is read once, at the first launch on that
device (`tables_for`); a device without a file, a CPU tensor (the interpreter) or a file that does
not parse gets `DEFAULT`: no tuned shapes, the skinny kernel's default heuristic up to `m_max` rows.
A file is written by `python -m engine.bench.kernels --out DIR --write-tuned` from its sweep.

File format (version 1); configs are SkinnyConfig fields, keyed by weight shape and M bucket (the
next power of two of the row count); an entry may leave out the last field, tma (then 0):

    {"format": 1, "device": "NVIDIA H200", "source": "...",
     "config_fields": ["block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages", "tma"],
     "linear": {"m_max": 16, "configs": {"6144x2560": {"1": [1, 16, 256, 1, 4, 1], ...}, ...}},
     "silu_mul_linear": {"m_max": 4, "configs": {"2560x9728": {"1": [...], ...}}},
     "add_rms_norm_linear": {"m_max": 0, "configs": {"6144x2560": {"1": [...], ...}}}}

`linear` and `add_rms_norm_linear` shapes are "NxK" of the weight; `silu_mul_linear` shapes are
"NxI" of the down weight [N, I] (its input is the [M, 2I] gate|up). For a listed shape a missing
bucket means the kernel loses there (cuBLAS / the unfused pair serves it); an unlisted shape uses
the default heuristic up to the section's `m_max` rows (add_rms_norm_linear: the projection's own
config, where it has no split-K). A section missing from a file is empty. A
malformed entry is dropped with a warning (so its bucket falls back to cuBLAS / the unfused pair),
a malformed file is ignored with a warning: bad tuning data costs speed, never results.
"""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

TUNED_DIR = Path(__file__).with_name("tuned")
FORMAT_VERSION = 1
# Untuned weight shapes: the skinny kernel (default config) up to this many rows, cuBLAS above.
DEFAULT_M_MAX = 16
# Untuned down shapes: the fused SwiGLU + down kernel up to this many rows, the unfused pair
# above. Each N tile recomputes silu over its K range, so the exp/div work grows with M / BLOCK_N
# relative to the weight stream; beyond a few rows only a measurement can say it still hides.
DEFAULT_FUSED_M_MAX = 4
# Shapes not listed in the add_rms_norm_linear section get the one-pass add + RMSNorm prologue at
# their projection's skinny config (where it has no split-K) up to this many rows. One row (the GEMV)
# only: on the H200 it saved 1.3-2 us per projection there, while the tl.dot path with the prologue
# ran gate|up 4x slower at 8-64 rows (kernel_ab, 2026-11-30).
DEFAULT_NORM_M_MAX = 1


class SkinnyConfig(NamedTuple):
    block_m: int  # 1: FMA GEMV path (M == 1 only); >= 16: tl.dot path
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int  # tl.dot path: Triton's pipeline stages; GEMV: >= 2 carries the next weight tile (gemv.py)
    tma: int = 0  # 1: tiles by TMA (gemm_tma.py) where the call can take it; tl.dot path only


Table = Mapping[tuple[int, int], Mapping[int, SkinnyConfig]]
CONFIG_FIELDS = list(SkinnyConfig._fields)
SECTIONS = ("linear", "silu_mul_linear", "add_rms_norm_linear")


@dataclass(frozen=True)
class TunedTables:
    device: str  # the slug, or "default"
    source: str | None = None  # the file it came from; None for DEFAULT
    m_max: int = DEFAULT_M_MAX
    fused_m_max: int = DEFAULT_FUSED_M_MAX
    linear: Table = field(default_factory=dict)  # {(N, K): {bucket: SkinnyConfig}}
    silu_mul_linear: Table = field(default_factory=dict)  # {(N, I): {bucket: SkinnyConfig}}
    norm_m_max: int = DEFAULT_NORM_M_MAX
    add_rms_norm_linear: Table = field(default_factory=dict)  # {(N, K): {bucket: SkinnyConfig}}
    note: str = ""  # free text kept in the file ("source")


DEFAULT = TunedTables(device="default")


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def tuned_path(device_name: str, directory: Path | None = None) -> Path:
    return (directory or TUNED_DIR) / f"{device_slug(device_name)}.json"


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def check_config(cfg: SkinnyConfig) -> str | None:
    """Why the skinny kernel cannot run this config, or None if it can."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in cfg):
        return "fields must be ints"
    bm, bn, bk, split, warps, stages, tma = cfg
    if not (bm == 1 or (_pow2(bm) and 16 <= bm <= 256)):
        return "block_m must be 1 or a power of two in 16..256"
    if not (_pow2(bn) and (8 if bm == 1 else 16) <= bn <= 512):
        return "block_n must be a power of two in 8..512 (16.. on the dot path)"
    if not (_pow2(bk) and 16 <= bk <= 1024):
        return "block_k must be a power of two in 16..1024"
    if not 1 <= split <= 64:
        return "split_k must be in 1..64"
    if warps not in (1, 2, 4, 8, 16):
        return "num_warps must be 1, 2, 4, 8 or 16"
    if not 1 <= stages <= 8:
        return "num_stages must be in 1..8"
    if tma not in (0, 1) or (tma and bm == 1):
        return "tma must be 0 or 1 (1 on the dot path only)"
    return None


def _parse_table(section: dict, what: str, where: str) -> dict[tuple[int, int], dict[int, SkinnyConfig]]:
    table: dict[tuple[int, int], dict[int, SkinnyConfig]] = {}
    for shape_key, buckets in section.get("configs", {}).items():
        m = re.fullmatch(r"(\d+)x(\d+)", shape_key)
        if m is None or not isinstance(buckets, dict):
            warnings.warn(f"{where}: {what} shape {shape_key!r} is not 'NxK' -> a bucket map; dropped", stacklevel=3)
            continue
        shape = (int(m[1]), int(m[2]))
        per_m = table.setdefault(shape, {})
        for bucket_key, entry in buckets.items():
            try:
                bucket = int(bucket_key)
                cfg = SkinnyConfig(*entry)
                why = "the bucket must be a power of two" if not _pow2(bucket) else check_config(cfg)
            except (TypeError, ValueError) as e:
                why = str(e)
            if why is None and cfg.block_m == 1 and bucket != 1:
                why = "the GEMV path (block_m 1) serves M == 1 only"
            if why is not None:
                warnings.warn(f"{where}: {what} {shape_key} M={bucket_key} {entry!r} dropped: {why}", stacklevel=3)
                continue
            per_m[bucket] = cfg
    return table


def parse(data: dict, source: str | None = None) -> TunedTables:
    """A TunedTables from the JSON object; raises ValueError if it is not a version-1 table."""
    where = source or "tuned table"
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        raise ValueError(f"{where}: not a format-{FORMAT_VERSION} tuned table")
    lin, fused, norm = (data.get(key, {}) for key in SECTIONS)
    if not all(isinstance(sec, dict) for sec in (lin, fused, norm)):
        raise ValueError(f"{where}: {', '.join(SECTIONS)} must be objects")
    m_max, fused_m_max = lin.get("m_max", DEFAULT_M_MAX), fused.get("m_max", DEFAULT_FUSED_M_MAX)
    norm_m_max = norm.get("m_max", DEFAULT_NORM_M_MAX)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (m_max, fused_m_max, norm_m_max)):
        raise ValueError(f"{where}: m_max must be a non-negative int")
    return TunedTables(
        device=device_slug(str(data.get("device", "unknown"))),
        source=source,
        m_max=m_max,
        fused_m_max=fused_m_max,
        linear=_parse_table(lin, "linear", where),
        silu_mul_linear=_parse_table(fused, "silu_mul_linear", where),
        norm_m_max=norm_m_max,
        add_rms_norm_linear=_parse_table(norm, "add_rms_norm_linear", where),
        note=str(data.get("source", "")),
    )


def load(device_name: str | None, directory: Path | None = None) -> TunedTables:
    """The tables for a device name (as torch.cuda.get_device_name gives it); DEFAULT when there is
    no file for it or the file does not parse (with a warning)."""
    if not device_name:
        return DEFAULT
    path = tuned_path(device_name, directory)
    if not path.is_file():
        return DEFAULT
    try:
        return parse(json.loads(path.read_text()), str(path))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        warnings.warn(f"ignoring the tuned table {path}: {e}; using the default heuristic", stacklevel=2)
        return DEFAULT


def _entry(cfg: SkinnyConfig) -> list[int]:
    """A config's list in the file: without its trailing tma field where that is 0."""
    return list(cfg) if cfg.tma else list(cfg)[:-1]


def to_json(t: TunedTables, device_name: str, note: str = "") -> dict:
    def section(table: Table, m_max: int) -> dict:
        return {
            "m_max": m_max,
            "configs": {
                f"{n}x{k}": {str(b): _entry(cfg) for b, cfg in sorted(per_m.items())} for (n, k), per_m in table.items()
            },
        }

    return {
        "format": FORMAT_VERSION,
        "device": device_name,
        "source": note or t.note,
        "config_fields": CONFIG_FIELDS,
        "linear": section(t.linear, t.m_max),
        "silu_mul_linear": section(t.silu_mul_linear, t.fused_m_max),
        "add_rms_norm_linear": section(t.add_rms_norm_linear, t.norm_m_max),
    }


def dumps(t: TunedTables, device_name: str, note: str = "") -> str:
    """JSON text with one line per shape (diff-friendly)."""
    data = to_json(t, device_name, note)
    lines = ["{"]
    for key in ("format", "device", "source", "config_fields"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(data[key])},")
    for i, key in enumerate(SECTIONS):
        sec = data[key]
        lines.append(f'  "{key}": {{"m_max": {sec["m_max"]}, "configs": {{')
        shapes = list(sec["configs"].items())
        for j, (shape, per_m) in enumerate(shapes):
            lines.append(f"    {json.dumps(shape)}: {json.dumps(per_m)}" + ("," if j < len(shapes) - 1 else ""))
        lines.append("  }}" + ("," if i < len(SECTIONS) - 1 else ""))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == data
    return text


_lock = threading.Lock()
_by_device: dict[tuple[str, int | None], TunedTables] = {}


def tables_for(device: torch.device) -> TunedTables:
    """The tables for the device a tensor lives on, loaded at its first use and cached."""
    key = (device.type, device.index)
    t = _by_device.get(key)
    if t is None:
        with _lock:
            t = _by_device.get(key)
            if t is None:
                name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
                t = _by_device[key] = load(name)
    return t


@contextmanager
def in_force(tables: TunedTables) -> Iterator[None]:
    """`tables` for every CUDA device while the block runs (a retune's A/B), then what was there."""
    keys = [("cuda", i) for i in range(torch.cuda.device_count())]
    with _lock:
        saved = {key: _by_device.get(key) for key in keys}
        _by_device.update(dict.fromkeys(keys, tables))
    try:
        yield
    finally:
        with _lock:
            for key, old in saved.items():
                if old is None:
                    _by_device.pop(key, None)
                else:
                    _by_device[key] = old


def reset() -> None:
    """Forget the loaded tables (the next launch re-reads the files)."""
    with _lock:
        _by_device.clear()
