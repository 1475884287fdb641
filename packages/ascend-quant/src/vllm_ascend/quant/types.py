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
CAPABILITY_TYPES: dict[str, tuple[str, ...]] = {"sparse_weight": ("W8A8S", "W8A8SC")}
"""Linear types a family runs only where its profile has the hardware capability (``HardwareCapability``
value) named by the key."""

LAYER_KINDS: tuple[str, ...] = ("linear", "moe", "attention")


def _capabilities(family: str | None) -> frozenset[str]:
    if family is None:
        return frozenset()
    from vllm_ascend.core.sdk import get_hardware_profile

    return frozenset(c.value for c in get_hardware_profile(family).capabilities)


def linear_types(family: str | None) -> tuple[str, ...]:
    """Linear types valid on ``family`` (a normalised family name, or None when unknown)."""
    have = _capabilities(family)
    return LINEAR_TYPES + tuple(t for cap, types in CAPABILITY_TYPES.items() if cap in have for t in types)


def tensor_types(family: str | None) -> tuple[str, ...]:
    """Every type string a per-tensor entry may carry on ``family``, without duplicates."""
    return tuple(dict.fromkeys((FLOAT, *linear_types(family), *MOE_TYPES, *ATTENTION_TYPES, *KV_CACHE_TYPES)))


def runs_on(quant_type: str, family: str | None) -> bool:
    """Whether ``family``'s profile has what ``quant_type`` needs (every family runs the types that need no
    capability; an unknown family runs only those)."""
    have = _capabilities(family)
    return all(cap in have for cap, types in CAPABILITY_TYPES.items() if quant_type in types)


def family_requirement(quant_type: str) -> str | None:
    """The families whose profiles run ``quant_type`` (comma-separated), or None when every family does."""
    from vllm_ascend.core.sdk import AscendDeviceType, get_hardware_profile

    for capability, types in CAPABILITY_TYPES.items():
        if quant_type in types:
            families = [f.value for f in AscendDeviceType if get_hardware_profile(f).supports(capability)]
            return ", ".join(families) or "no"
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
