"""config.json entries read with their types checked, and what the engine cannot run refused."""

from __future__ import annotations

import numbers

from engine.loader import CheckpointError

FULL, SLIDING = "full_attention", "sliding_attention"


def rope_theta(d: dict, where: str) -> float:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: config rope_parameters={params!r}; expected an object")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise CheckpointError(f"{where}: rope type {rope_type!r} is not supported (only default RoPE)")
    theta = d.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise CheckpointError(f"{where}: config has neither rope_theta nor rope_parameters.rope_theta")
    return read_positive(d, "rope_theta", where, theta)


def need(d: dict, key: str, where: str):
    if key not in d:
        raise CheckpointError(f"{where}: config.json lacks {key!r}")
    return d[key]


def is_int(value: object) -> bool:
    """An integer (a NumPy one too), not a bool: every int field's and token id's check."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def read_int(d: dict, key: str, where: str, default: int | None = None, low: int = 1) -> int:
    """An integer config entry (JSON 64, not 64.5, "64" or true), at least `low`; a missing or null
    entry takes the default, or is an error without one."""
    value = need(d, key, where) if default is None else d.get(key)
    value = default if value is None else value
    if not is_int(value) or value < low:
        raise CheckpointError(f"{where}: config {key}={value!r}; expected an int >= {low}")
    return value


def read_positive(d: dict, key: str, where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise CheckpointError(f"{where}: config {key}={value!r}; expected a finite number > 0")
    return float(value)


def check_supported(d: dict, where: str, num_layers: int, max_positions: int) -> None:
    """Refuse what the engine would silently run differently: it has full causal attention only, no
    q/k/v/o biases, SwiGLU only and unquantized weights (HF honours all of these)."""
    quant = d.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise CheckpointError(f"{where}: quantized checkpoint ({method}); the engine loads unquantized weights only")
    if d.get("attention_bias"):
        raise CheckpointError(f"{where}: attention_bias=true is not supported (no q/k/v/o biases in the engine)")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act={act!r} is not supported (SwiGLU with silu only)")
    # HF: the window is sliding_window when use_sliding_window, on the layers typed sliding_attention
    # (explicit layer_types, else those from max_window_layers on).
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    types = d.get("layer_types")
    if types is None:
        first = read_int(d, "max_window_layers", where, 28, low=0)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers:
        raise CheckpointError(f"{where}: layer_types={types!r}; expected one entry per layer ({num_layers})")
    other = sorted({t for t in types if t not in (FULL, SLIDING)}, key=str)
    if other:
        raise CheckpointError(f"{where}: layer_types {other} are not supported (full attention only)")
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    if sliding and not (is_int(window) and window >= max_positions):
        raise CheckpointError(
            f"{where}: sliding-window attention (sliding_window={window!r} on layers {sliding}, "
            f"use_sliding_window={d.get('use_sliding_window')!r}) is not supported: the engine runs full "
            "attention on every layer"
        )
