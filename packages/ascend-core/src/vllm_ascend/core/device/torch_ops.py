"""The device ops the graph passes target, as torch custom ops ``torch.ops.vllm_ascend.<name>``.

Each op runs the current device adaptor's method (so eager results and ``call_counts`` are the
adaptor's) and has a fake implementation computing only output shapes, dtypes and strides, so
``torch.compile`` traces one opaque node per call on every device instead of the adaptor's body.
Outputs are contiguous on every device (the fakes say so). ``torch.library`` refuses optional tensor
returns and keyword-only tensor arguments, so ``rotary_embedding`` returns a list (``[q]`` or
``[q, k]``) and the keyword-only arguments of ``dynamic_quant`` / ``quant_matmul`` are positional in
the schema; :func:`device_ops` gives the adaptor's signatures back, typed.

Attention itself is not here: vLLM calls it through its own opaque ``torch.ops.vllm.
unified_attention_with_output`` (the platform's ``opaque_attention_op()`` is True), and the KV-cache
write through ``torch.ops.vllm.unified_kv_cache_update``, inside which the backend calls
``reshape_and_cache`` below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.config import get_device_adaptor

#: The ``torch.ops`` namespace of the plugin's ops.
NAMESPACE = "vllm_ascend"


# -- implementations: the current adaptor, outputs made contiguous ---------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return get_device_adaptor().rms_norm(x, weight, eps).contiguous()


def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    normed, total = get_device_adaptor().add_rms_norm(x, residual, weight, eps)
    return normed.contiguous(), total.contiguous()


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    return get_device_adaptor().swiglu(x).contiguous()


def _rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> list[torch.Tensor]:
    q, k = get_device_adaptor().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    return [q.contiguous()] if k is None else [q.contiguous(), k.contiguous()]


def _reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    get_device_adaptor().reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def _dynamic_quant(
    x: torch.Tensor, smooth_scales: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = get_device_adaptor().dynamic_quant(x, smooth_scales=smooth_scales)
    return q.contiguous(), scale.contiguous()


def _quantize(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    return get_device_adaptor().quantize(x, scale, offset).contiguous()


def _quant_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    out = get_device_adaptor().quant_matmul(
        x, weight, weight_scale, pertoken_scale=pertoken_scale, bias=bias, output_dtype=output_dtype
    )
    return out.contiguous()


def _add_rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    q, total = get_device_adaptor().add_rms_norm_quant(x, residual, weight, eps, scale, offset)
    return q.contiguous(), total.contiguous()


def _add_rms_norm_dynamic_quant(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    smooth_scales: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, scale, total = get_device_adaptor().add_rms_norm_dynamic_quant(x, residual, weight, eps, smooth_scales)
    return q.contiguous(), scale.contiguous(), total.contiguous()


def _rms_norm_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, scale: torch.Tensor, offset: torch.Tensor | None
) -> torch.Tensor:
    return get_device_adaptor().rms_norm_quant(x, weight, eps, scale, offset).contiguous()


def _rms_norm_dynamic_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, smooth_scales: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = get_device_adaptor().rms_norm_dynamic_quant(x, weight, eps, smooth_scales)
    return q.contiguous(), scale.contiguous()


def _swiglu_quant(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    return get_device_adaptor().swiglu_quant(x, scale, offset).contiguous()


def _swiglu_dynamic_quant(
    x: torch.Tensor, smooth_scales: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = get_device_adaptor().swiglu_dynamic_quant(x, smooth_scales)
    return q.contiguous(), scale.contiguous()


def _qk_rmsnorm_rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = get_device_adaptor().qk_rmsnorm_rope(
        positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox
    )
    return q.contiguous(), k.contiguous()


def _muls_add(x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
    return get_device_adaptor().muls_add(x, scale, y).contiguous()


# -- fakes: output metadata only ---------------------------------------------------------------


def _like(
    x: torch.Tensor, shape: Sequence[Any] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    return x.new_empty(tuple(x.shape) if shape is None else tuple(shape), dtype=dtype or x.dtype)


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _like(x)


def _add_rms_norm_fake(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != residual.shape:
        raise DeviceOpError(
            f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape"
        )
    return _like(x), _like(x)


def _swiglu_fake(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2 != 0:
        raise DeviceOpError(f"swiglu needs an even last dim, got {x.shape[-1]}")
    return _like(x, (*x.shape[:-1], x.shape[-1] // 2))


def _rotary_embedding_fake(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> list[torch.Tensor]:
    return [_like(query)] if key is None else [_like(query), _like(key)]


def _reshape_and_cache_fake(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    return None


def _dynamic_quant_fake(
    x: torch.Tensor, smooth_scales: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() < 2:
        raise DeviceOpError(f"dynamic_quant needs x with at least 2 dims, got shape {tuple(x.shape)}")
    return _like(x, dtype=torch.int8), _like(x, x.shape[:-1], torch.float32)


def _quantize_fake(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    return _like(x, dtype=torch.int8)


def _quant_matmul_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    if weight.dtype not in (torch.int8, torch.int32) or weight.dim() != 2:
        raise DeviceOpError(
            f"weight must be int8 [K, N] or int4 packed in int32 [K, N/8], got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise DeviceOpError(
            f"x [..., K] and weight [K, N] disagree: {tuple(x.shape)} vs {tuple(weight.shape)}"
        )
    n_dim = weight.shape[1] * (8 if weight.dtype == torch.int32 else 1)
    return _like(x, (*x.shape[:-1], n_dim), output_dtype)


def _check_same_shape(name: str, x: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    if x.shape != other.shape:
        raise DeviceOpError(
            f"{name} {tuple(x.shape)} and {other_name} {tuple(other.shape)} must have the same shape"
        )


def _add_rms_norm_quant_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_same_shape("x", x, "residual", residual)
    return _like(x, dtype=torch.int8), _like(x)


def _add_rms_norm_dynamic_quant_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    smooth_scales: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_same_shape("x", x, "residual", residual)
    q, scale = _dynamic_quant_fake(x)
    return q, scale, _like(x)


def _rms_norm_quant_fake(
    x: torch.Tensor, weight: torch.Tensor, eps: float, scale: torch.Tensor, offset: torch.Tensor | None
) -> torch.Tensor:
    return _like(x, dtype=torch.int8)


def _rms_norm_dynamic_quant_fake(
    x: torch.Tensor, weight: torch.Tensor, eps: float, smooth_scales: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _dynamic_quant_fake(x)


def _swiglu_quant_fake(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    return _swiglu_fake(x).to(torch.int8)


def _swiglu_dynamic_quant_fake(
    x: torch.Tensor, smooth_scales: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _dynamic_quant_fake(_swiglu_fake(x))


def _qk_rmsnorm_rope_fake(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    for name, x in (("query", query), ("key", key)):
        if x.dim() != 2 or x.shape[-1] % head_size != 0:
            raise DeviceOpError(
                f"qk_rmsnorm_rope needs {name} [T, heads*{head_size}], got shape {tuple(x.shape)}"
            )
    return _like(query), _like(key)


def _muls_add_fake(x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
    _check_same_shape("x", x, "y", y)
    if x.dtype != y.dtype:
        raise DeviceOpError(f"muls_add needs x and y of one dtype, got {x.dtype} and {y.dtype}")
    return _like(x)


@dataclass(frozen=True)
class _OpSpec:
    name: str
    impl: Callable[..., Any]
    fake: Callable[..., Any]
    mutates_args: tuple[str, ...] = ()


_SPECS: tuple[_OpSpec, ...] = (
    _OpSpec("rms_norm", _rms_norm, _rms_norm_fake),
    _OpSpec("add_rms_norm", _add_rms_norm, _add_rms_norm_fake),
    _OpSpec("swiglu", _swiglu, _swiglu_fake),
    _OpSpec("rotary_embedding", _rotary_embedding, _rotary_embedding_fake),
    _OpSpec("reshape_and_cache", _reshape_and_cache, _reshape_and_cache_fake, ("key_cache", "value_cache")),
    _OpSpec("dynamic_quant", _dynamic_quant, _dynamic_quant_fake),
    _OpSpec("quantize", _quantize, _quantize_fake),
    _OpSpec("quant_matmul", _quant_matmul, _quant_matmul_fake),
    _OpSpec("add_rms_norm_quant", _add_rms_norm_quant, _add_rms_norm_quant_fake),
    _OpSpec("add_rms_norm_dynamic_quant", _add_rms_norm_dynamic_quant, _add_rms_norm_dynamic_quant_fake),
    _OpSpec("rms_norm_quant", _rms_norm_quant, _rms_norm_quant_fake),
    _OpSpec("rms_norm_dynamic_quant", _rms_norm_dynamic_quant, _rms_norm_dynamic_quant_fake),
    _OpSpec("swiglu_quant", _swiglu_quant, _swiglu_quant_fake),
    _OpSpec("swiglu_dynamic_quant", _swiglu_dynamic_quant, _swiglu_dynamic_quant_fake),
    _OpSpec("qk_rmsnorm_rope", _qk_rmsnorm_rope, _qk_rmsnorm_rope_fake),
    _OpSpec("muls_add", _muls_add, _muls_add_fake),
)

#: The fused ops among them (the graph fusion passes' targets).
FUSED_TORCH_OPS: tuple[str, ...] = (
    "add_rms_norm_quant",
    "add_rms_norm_dynamic_quant",
    "rms_norm_quant",
    "rms_norm_dynamic_quant",
    "swiglu_quant",
    "swiglu_dynamic_quant",
    "qk_rmsnorm_rope",
    "muls_add",
)

#: Names of the registered ops, ``torch.ops.vllm_ascend.<name>``.
DEVICE_TORCH_OPS: tuple[str, ...] = tuple(spec.name for spec in _SPECS)

_lock = threading.Lock()
_registered = False


def expected_schema(name: str) -> str:
    """The schema ``vllm_ascend::<name>`` is registered with (from the implementation's annotations)."""
    spec = next((s for s in _SPECS if s.name == name), None)
    if spec is None:
        raise KeyError(f"{name!r} is not a vllm_ascend device op; known: {', '.join(DEVICE_TORCH_OPS)}")
    args = torch.library.infer_schema(spec.impl, mutates_args=spec.mutates_args)
    return f"{NAMESPACE}::{name}{args}"


def _registered_schema(name: str) -> Any:
    """The ``FunctionSchema`` ``vllm_ascend::<name>`` is defined with in this process, or None."""
    try:
        packet = getattr(getattr(torch.ops, NAMESPACE), name)
    except AttributeError:
        return None
    return packet.default._schema


def register_device_ops() -> None:
    """Define every op of :data:`DEVICE_TORCH_OPS` once per process (later calls return at once).

    An op already defined with the same schema (e.g. by an earlier copy of this module) is kept; one
    defined with another schema raises ``RuntimeError`` naming both.
    """
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        for spec in _SPECS:
            schema = expected_schema(spec.name)
            existing = _registered_schema(spec.name)
            if existing is not None:
                if existing != torch._C.parse_schema(schema):
                    raise RuntimeError(
                        f"torch op {NAMESPACE}::{spec.name} is already defined as '{existing}'; "
                        f"vllm-ascend needs '{schema}'"
                    )
                continue
            op = torch.library.custom_op(
                f"{NAMESPACE}::{spec.name}", spec.impl, mutates_args=spec.mutates_args
            )
            op.register_fake(spec.fake)
        _registered = True


class DeviceOps:
    """The registered ops with the adaptor's signatures; each call is one ``torch.ops.vllm_ascend`` call."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.ops.vllm_ascend.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, total = torch.ops.vllm_ascend.add_rms_norm(x, residual, weight, eps)
        return normed, total

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.vllm_ascend.swiglu(x)

    def rotary_embedding(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.ops.vllm_ascend.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        return out[0], (out[1] if key is not None else None)

    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        torch.ops.vllm_ascend.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)

    def dynamic_quant(
        self, x: torch.Tensor, *, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = torch.ops.vllm_ascend.dynamic_quant(x, smooth_scales)
        return q, scale

    def quantize(self, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.vllm_ascend.quantize(x, scale, offset)

    def quant_matmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        *,
        pertoken_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        output_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        return torch.ops.vllm_ascend.quant_matmul(x, weight, weight_scale, pertoken_scale, bias, output_dtype)

    def add_rms_norm_quant(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: torch.Tensor,
        offset: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, total = torch.ops.vllm_ascend.add_rms_norm_quant(x, residual, weight, eps, scale, offset)
        return q, total

    def add_rms_norm_dynamic_quant(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        smooth_scales: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, scale, total = torch.ops.vllm_ascend.add_rms_norm_dynamic_quant(
            x, residual, weight, eps, smooth_scales
        )
        return q, scale, total

    def rms_norm_quant(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: torch.Tensor,
        offset: torch.Tensor | None,
    ) -> torch.Tensor:
        return torch.ops.vllm_ascend.rms_norm_quant(x, weight, eps, scale, offset)

    def rms_norm_dynamic_quant(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = torch.ops.vllm_ascend.rms_norm_dynamic_quant(x, weight, eps, smooth_scales)
        return q, scale

    def swiglu_quant(self, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.vllm_ascend.swiglu_quant(x, scale, offset)

    def swiglu_dynamic_quant(
        self, x: torch.Tensor, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = torch.ops.vllm_ascend.swiglu_dynamic_quant(x, smooth_scales)
        return q, scale

    def qk_rmsnorm_rope(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = torch.ops.vllm_ascend.qk_rmsnorm_rope(
            positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox
        )
        return q, k

    def muls_add(self, x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.vllm_ascend.muls_add(x, scale, y)


_DEVICE_OPS = DeviceOps()


def device_ops() -> DeviceOps:
    """The typed accessor of the registered ops (registering them on first use)."""
    if not _registered:
        register_device_ops()
    return _DEVICE_OPS
