"""Model configurations parsed from HF-style config.json dicts: entries read with their types checked,
and what the engine cannot run refused."""

from __future__ import annotations

from dataclasses import dataclass

from engine.loader import CheckpointError, is_int

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
    return read_positive("rope_theta", where, theta)


def read_int(d: dict, key: str, where: str, default: int | None = None, low: int = 1) -> int:
    """An integer config entry (JSON 64, not 64.5, "64" or true), at least `low`; a missing or null
    entry takes the default, or is an error without one."""
    if default is None and key not in d:
        raise CheckpointError(f"{where}: config.json lacks {key!r}")
    value = default if d.get(key) is None else d[key]
    if not is_int(value) or value < low:
        raise CheckpointError(f"{where}: config {key}={value!r}; expected an int >= {low}")
    return value


def read_positive(key: str, where: str, value) -> float:
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


@dataclass(frozen=True)
class Geometry:
    """The decoder-stack geometry shared by the Qwen3 target and DFlash drafters."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> Geometry:
        hidden = read_int(d, "hidden_size", where)
        heads = read_int(d, "num_attention_heads", where)
        g = cls(
            vocab_size=read_int(d, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=read_int(d, "intermediate_size", where),
            num_layers=read_int(d, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=read_int(d, "num_key_value_heads", where, heads),
            head_dim=read_int(d, "head_dim", where, hidden // heads),
            rms_norm_eps=read_positive("rms_norm_eps", where, d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta(d, where),
            max_position_embeddings=read_int(d, "max_position_embeddings", where, 32768, low=2),
        )
        if g.num_heads % g.num_kv_heads:
            raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of {g.num_kv_heads}")
        check_supported(d, where, g.num_layers, g.max_position_embeddings)
        return g

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class Qwen3Config:
    geometry: Geometry
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: dict, where: str = "target") -> Qwen3Config:
        archs = d.get("architectures") or []
        if d.get("model_type") != "qwen3" and "Qwen3ForCausalLM" not in archs:
            raise CheckpointError(
                f"{where}: not a Qwen3 dense checkpoint (model_type={d.get('model_type')!r}, architectures={archs})"
            )
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if not all(is_int(i) and i >= 0 for i in eos_ids):
            raise CheckpointError(f"{where}: config eos_token_id={eos!r}; expected a token id or a list of them")
        tied = d.get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise CheckpointError(f"{where}: config tie_word_embeddings={tied!r}; expected true or false")
        return cls(Geometry.from_dict(d, where), tied, eos_ids)


ZLAB = "zlab"
DEEPSPEC = "deepspec"


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash/DSpark drafter: z-lab layout (anchor-drop, B-1 drafts) or DeepSpec (anchor-first, B drafts)."""

    geometry: Geometry
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    layout: str
    markov_rank: int = 0
    num_target_layers: int | None = None

    @property
    def anchor_first(self) -> bool:
        return self.layout == DEEPSPEC

    @property
    def drafts_per_round(self) -> int:
        return self.block_size if self.anchor_first else self.block_size - 1

    @property
    def feature_size(self) -> int:
        return len(self.target_layer_ids) * self.geometry.hidden_size

    @classmethod
    def from_dict(cls, d: dict, where: str = "drafter") -> DFlashConfig:
        # The layout is the checkpoint's schema, never the Markov head (a z-lab drafter may carry one too).
        nested = d.get("dflash_config")
        if isinstance(nested, dict):  # z-lab: block size and Markov keys may also sit at the top level
            layout, src = ZLAB, {k: d[k] for k in ("block_size", "markov_rank", "markov_head_type") if k in d} | nested
        elif "target_layer_ids" in d:
            layout, src = DEEPSPEC, d  # DeepSpec's flat keys: anchor-first
        else:
            raise CheckpointError(f"{where}: not a DFlash drafter config (no dflash_config, no target_layer_ids)")
        layers = src.get("target_layer_ids")
        if not isinstance(layers, (list, tuple)) or not all(is_int(i) for i in layers):
            raise CheckpointError(f"{where}: config target_layer_ids={layers!r}; expected a list of layer indices")
        rank = read_int(src, "markov_rank", where, 0, low=0)
        head_type = src.get("markov_head_type")
        if rank > 0 and head_type not in (None, "vanilla"):
            raise CheckpointError(f"{where}: markov_head_type {head_type!r} is not supported (only 'vanilla')")
        return cls(
            geometry=Geometry.from_dict(d, where),
            block_size=read_int(src, "block_size", where, low=2),
            mask_token_id=read_int(src, "mask_token_id", where, low=0),
            target_layer_ids=tuple(layers),
            layout=layout,
            markov_rank=rank,
            num_target_layers=None if d.get("num_target_layers") is None else read_int(d, "num_target_layers", where),
        )

    def check_fits(self, target: Qwen3Config) -> None:
        """Geometry checks against the target; the error names both values."""
        t, g = target.geometry, self.geometry
        pairs = [
            ("hidden_size", g.hidden_size, t.hidden_size),
            ("num_attention_heads", g.num_heads, t.num_heads),
            ("num_key_value_heads", g.num_kv_heads, t.num_kv_heads),
            ("head_dim", g.head_dim, t.head_dim),
            ("vocab_size", g.vocab_size, t.vocab_size),
            ("rope_theta", g.rope_theta, t.rope_theta),
        ]
        if self.num_target_layers is not None:
            pairs.append(("num_target_layers", self.num_target_layers, t.num_layers))
        for name, mine, theirs in pairs:
            if mine != theirs:
                raise CheckpointError(f"drafter {name}={mine} does not match the target's {name}={theirs}")
        ids = self.target_layer_ids
        if not ids:
            raise CheckpointError("drafter target_layer_ids is empty")
        if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
            raise CheckpointError(f"drafter target_layer_ids {list(ids)} must be strictly increasing")
        if ids[0] < 0 or ids[-1] >= t.num_layers:
            raise CheckpointError(
                f"drafter target_layer_ids {list(ids)} out of range for a target with {t.num_layers} layers"
            )
        if not 0 <= self.mask_token_id < t.vocab_size:
            raise CheckpointError(f"drafter mask_token_id={self.mask_token_id} outside the target vocab {t.vocab_size}")
