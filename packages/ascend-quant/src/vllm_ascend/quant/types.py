"""The ModelSlim quantization type vocabulary: which type string is valid for which layer kind."""

from __future__ import annotations

FLOAT = "FLOAT"
"""Per-tensor type of a tensor that ModelSlim left unquantized."""

LINEAR_TYPES: tuple[str, ...] = (
    "W8A8",
    "W8A8_DYNAMIC",
    "W8A16",
    "W4A16",
    "W4A8_DYNAMIC",
    "W4A4_DYNAMIC",
    "W4A4_FLATQUANT_DYNAMIC",
    "W4A4_MXFP4",
    "W4A4_MXFP4_FLATQUANT",
    "W4A8_MXFP",
    "W8A8_MXFP8",
    "W8A8_MIX",
    "W8A8FP8_DYNAMIC",
)
MOE_TYPES: tuple[str, ...] = (
    "W8A8_DYNAMIC",
    "W4A8_DYNAMIC",
    "W4A16",
    "W4A16_MXFP4",
    "W4A4_MXFP4",
    "W4A8_MXFP",
    "W8A8_MXFP8",
    "W8A8FP8_DYNAMIC",
)
ATTENTION_TYPES: tuple[str, ...] = ("FAKQuant", "INT8_DYNAMIC")
KV_CACHE_TYPES: tuple[str, ...] = ("C8",)
FAMILY_ONLY_TYPES: dict[str, tuple[str, ...]] = {"310P": ("W8A8S", "W8A8SC")}
"""Linear types that exist only on one device family."""

LAYER_KINDS: tuple[str, ...] = ("linear", "moe", "attention")


def linear_types(family: str | None) -> tuple[str, ...]:
    """Linear types valid on ``family`` (a normalised family name, or None when unknown)."""
    return LINEAR_TYPES + FAMILY_ONLY_TYPES.get(family or "", ())


def tensor_types(family: str | None) -> tuple[str, ...]:
    """Every type string a per-tensor entry may carry on ``family``, without duplicates."""
    return tuple(dict.fromkeys((FLOAT, *linear_types(family), *MOE_TYPES, *ATTENTION_TYPES, *KV_CACHE_TYPES)))


def family_requirement(quant_type: str) -> str | None:
    """The only family that supports ``quant_type``, or None when it is not family-specific."""
    for family, types in FAMILY_ONLY_TYPES.items():
        if quant_type in types:
            return family
    return None


def allowed_for(layer_kind: str, family: str | None) -> tuple[str, ...]:
    """Quantized types a layer of ``layer_kind`` can run on ``family``."""
    if layer_kind == "linear":
        return linear_types(family)
    if layer_kind == "moe":
        return MOE_TYPES
    if layer_kind == "attention":
        return ATTENTION_TYPES + KV_CACHE_TYPES
    raise ValueError(f"layer_kind must be one of {', '.join(LAYER_KINDS)}, got {layer_kind!r}")
