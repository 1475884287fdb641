"""Scheme interfaces: the checkpoint tensors of a quantized linear / MoE layer, their checks and the run path.

A scheme declares its checkpoint tensors (:class:`TensorSpec`), validates what was loaded into the layer
(dtype, shape, value ranges) with a :class:`~vllm_ascend.quant.errors.QuantLoadError` naming the layer,
the tensor and the expectation, converts them to the layout the device adaptor's ops take, and computes
the layer only through those ops. Nothing here imports vLLM.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, cast

import torch

from vllm_ascend.core.sdk import (
    BaseDeviceAdaptor,
    WeightFormat,
    get_current_hardware_profile,
    get_device_adaptor,
)
from vllm_ascend.kernels.device import pack_int4
from vllm_ascend.quant.errors import QuantLoadError

TENSOR_KINDS: tuple[str, ...] = (
    "weight",
    "channel",
    "group",
    "tensor",
    "blob",
    "expert_weight",
    "expert_channel",
)
INT8_RANGE = (-128, 127)
INT4_RANGE = (-8, 7)
INT4_PER_INT32 = 8


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor of a layer: shape, dtype (None = the model's params_dtype) and layout kind.

    Kinds: ``"weight"`` ``[out, in]``; ``"channel"`` ``[out, ...]`` (sharded on dim 0 with the output);
    ``"group"`` ``[out, G]`` (per-group scale/offset, ``G = in / group_size``); ``"tensor"`` ``[1]`` (one
    value per fused shard); ``"blob"`` a 1-D tensor per fused shard whose size only the checkpoint knows
    (compressed weights: never split by tensor parallelism, the shards' blobs concatenated in shard order,
    ``shape`` is ``(0,)``); ``"expert_weight"`` ``[E, out, in]``; ``"expert_channel"`` ``[E, out, 1]``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype | None
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in TENSOR_KINDS:
            raise ValueError(
                f"TensorSpec.kind={self.kind!r} is invalid; allowed values: {', '.join(TENSOR_KINDS)}"
            )


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype} {tuple(t.shape)}"


class _Scheme(abc.ABC):
    """What linear and MoE schemes share: construction, loaded-tensor lookup, checks and param replacement."""

    quant_type: ClassVar[str]
    layer_type: ClassVar[str]

    def __init__(self, *, prefix: str, group_size: int | None, params_dtype: torch.dtype) -> None:
        if group_size is not None and (
            isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0
        ):
            raise QuantLoadError(
                f"layer {prefix!r} ({self.quant_type}): group_size must be an integer >= 0 or absent, got {group_size!r}"
            )
        self.prefix = prefix
        self.group_size = group_size
        self.params_dtype = params_dtype

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prefix={self.prefix!r}, group_size={self.group_size})"

    def error(self, name: str, expected: str, got: str) -> QuantLoadError:
        """A load error naming the layer's tensor ``name``, what was expected and what was found."""
        return QuantLoadError(
            f"{self.prefix}.{name} ({self.quant_type} {self.layer_type}): expected {expected}, got {got}"
        )

    def loaded(self, layer: torch.nn.Module, name: str) -> torch.Tensor:
        """The tensor ``name`` loaded into ``layer`` (detached), or an error when it was never created/loaded."""
        t = getattr(layer, name, None)
        if not isinstance(t, torch.Tensor):
            raise self.error(
                name, "a tensor loaded from the checkpoint", "none (missing from the checkpoint?)"
            )
        return t.detach()

    def dtype_ok(self, name: str, t: torch.Tensor, spec: TensorSpec) -> bool:
        """Whether ``t``'s dtype fits ``spec``: any float for float specs, the exact dtype otherwise."""
        if spec.dtype is None or spec.dtype.is_floating_point:
            return t.is_floating_point()
        return t.dtype == spec.dtype

    def check_specs(self, layer: torch.nn.Module, specs: dict[str, TensorSpec]) -> dict[str, torch.Tensor]:
        """Fetch every tensor of ``specs`` from ``layer``, checking presence, dtype and shape."""
        tensors: dict[str, torch.Tensor] = {}
        for name, spec in specs.items():
            t = self.loaded(layer, name)
            if not self.dtype_ok(name, t, spec):
                want = (
                    "a floating-point dtype"
                    if spec.dtype is None or spec.dtype.is_floating_point
                    else spec.dtype
                )
                raise self.error(name, f"dtype {want}", _describe(t))
            if spec.kind == "tensor":
                if t.numel() < 1 or t.dim() > 2:
                    raise self.error(name, "one value per fused shard (shape [1] or [shards])", _describe(t))
            elif spec.kind == "blob":
                if t.dim() != 1 or t.numel() < 1:
                    raise self.error(name, "a non-empty 1-D tensor", _describe(t))
            elif tuple(t.shape) != spec.shape:
                raise self.error(name, f"shape {spec.shape} ({spec.kind})", _describe(t))
            tensors[name] = t
        return tensors

    def check_sizes(self, **sizes: int) -> None:
        """Layer sizes must be positive integers."""
        for field, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise QuantLoadError(
                    f"layer {self.prefix!r} ({self.quant_type}): {field} must be a positive integer, got {value!r}"
                )

    def check_finite(self, name: str, t: torch.Tensor) -> None:
        """Scales must be finite numbers."""
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            raise self.error(name, "finite values", f"{int(bad.sum())} NaN/inf value(s)")

    def check_range(self, name: str, t: torch.Tensor, lo: int, hi: int, what: str) -> None:
        """Integer values of ``t`` must lie in ``[lo, hi]`` (``what`` says why)."""
        if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
            raise self.error(name, f"{what} in [{lo}, {hi}]", f"values in [{int(t.min())}, {int(t.max())}]")

    def check_integral(self, name: str, t: torch.Tensor, lo: int, hi: int) -> None:
        """A float tensor holding integer values in ``[lo, hi]`` (ModelSlim stores offsets as floats)."""
        self.check_finite(name, t)
        frac = t.double() != torch.round(t.double())
        if bool(frac.any()):
            raise self.error(
                name, "integer values", f"non-integer value {float(t.reshape(-1)[frac.reshape(-1)][0])}"
            )
        self.check_range(name, t.double(), lo, hi, "integer values")

    def check_zero(self, name: str, t: torch.Tensor) -> None:
        """Symmetric schemes: every offset must be 0."""
        if bool((t != 0).any()):
            raise self.error(
                name,
                "all zeros (this scheme is symmetric)",
                f"max |offset| = {float(t.double().abs().max())}",
            )

    def check_shared(self, layer: torch.nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
        """A per-tensor value must agree across the shards of a fused layer; returns it as fp32 ``[1]``.

        Shards are named from ``layer.shard_names`` when the layer carries it, else by index.
        """
        flat = t.reshape(-1).float()
        if bool((flat != flat[0]).any()):
            names = getattr(layer, "shard_names", None)
            labels = (
                list(names) if names is not None and len(names) == flat.numel() else list(range(flat.numel()))
            )
            values = ", ".join(
                f"{label}={float(v):.6g}" for label, v in zip(labels, flat.tolist(), strict=True)
            )
            raise self.error(name, "one value shared by every fused shard", f"different values ({values})")
        return flat[:1].clone()

    def check_packable(self, name: str, size: int) -> None:
        """Int4 packing puts 8 values in one int32 along the last (output) dimension."""
        if size % INT4_PER_INT32:
            raise self.error(
                name, f"an output dimension divisible by {INT4_PER_INT32} to pack int4 into int32", f"{size}"
            )

    def replace_params(
        self, layer: torch.nn.Module, runtime: dict[str, torch.Tensor], drop: set[str]
    ) -> None:
        """Swap the loaded params for the runtime tensors (frozen Parameters) and delete the ``drop`` ones."""
        for name in (*runtime, *drop):
            if hasattr(layer, name):
                delattr(layer, name)
        for name, value in runtime.items():
            layer.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))


def adaptor() -> BaseDeviceAdaptor:
    """The current device's adaptor (every quantized op runs through it)."""
    return get_device_adaptor()


def weight_format(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (made contiguous) in the storage format the current device wants for quantized weights."""
    fmt = cast(WeightFormat, get_current_hardware_profile().quant_weight_format)  # checked by the profile
    return adaptor().cast_weight_format(weight.contiguous(), fmt)


def pack_int4_last(weight: torch.Tensor) -> torch.Tensor:
    """Pack int4 values (int8 in [-8, 7]) along the last dim into int32 (8 per word), core's layout."""
    return pack_int4(weight.contiguous())


class AscendLinearScheme(_Scheme):
    """A quantized linear layer: ``weight_specs`` → load → ``process_weights`` → ``apply``.

    ``group_size`` is the description's global (None when absent); per-channel schemes ignore it.
    """

    layer_type: ClassVar[str] = "linear"
    #: Why a row-parallel layer of this scheme cannot be split over tensor-parallel ranks (None: it can).
    ROW_PARALLEL_UNSUPPORTED: ClassVar[str | None] = None
    #: Why no layer of this scheme can be split over tensor-parallel ranks (None: it can).
    TENSOR_PARALLEL_UNSUPPORTED: ClassVar[str | None] = None

    @abc.abstractmethod
    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """Checkpoint tensors of one (unsharded or per-partition) layer, keyed by suffix."""

    @abc.abstractmethod
    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Scheme-specific checks of the loaded values (ranges, symmetric offsets, shared shard values)."""

    @abc.abstractmethod
    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The runtime tensors (layout the adaptor ops take), keyed by param name."""

    @abc.abstractmethod
    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., in]`` (float) → ``[..., out]`` in ``x.dtype``, only through the device adaptor's ops."""

    def layer_sizes(self, layer: torch.nn.Module) -> tuple[int, int]:
        """``(out, in)`` of the loaded layer, read from its 2-D ``weight``."""
        weight = self.loaded(layer, "weight")
        if weight.dim() != 2:
            raise self.error("weight", "a 2-D [out, in] tensor", _describe(weight))
        return weight.shape[0], weight.shape[1]

    def process_weights(self, layer: torch.nn.Module) -> None:
        """Validate the loaded tensors, then replace them with the runtime layout (called once after loading)."""
        specs = self.weight_specs(*self.layer_sizes(layer))
        tensors = self.check_specs(layer, specs)
        self.validate(layer, tensors)
        runtime = self.runtime(tensors)
        self.replace_params(layer, runtime, set(specs) - set(runtime))


class AscendMoEScheme(_Scheme):
    """The experts of a MoE layer (gate/up fused as ``w13``, down as ``w2``), routed through the adaptor's ops."""

    layer_type: ClassVar[str] = "moe"
    RUNTIME: ClassVar[tuple[str, ...]] = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")

    @abc.abstractmethod
    def weight_specs(
        self, num_experts: int, hidden_size: int, intermediate_size: int
    ) -> dict[str, TensorSpec]:
        """Checkpoint tensors of the layer's (local) experts, keyed by vLLM's fused-MoE param names."""

    @abc.abstractmethod
    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Scheme-specific checks of the loaded values."""

    @abc.abstractmethod
    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The runtime tensors (every one with the expert on dim 0), keyed by :attr:`RUNTIME` names."""

    @abc.abstractmethod
    def apply_experts(self, layer: torch.nn.Module, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Token copies grouped by expert (``counts [E]`` rows each, rows past the groups are padding) →
        the experts' output rows ``[M, H]`` in fp32; what every MoE communication method calls."""

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """``x [T, H]`` routed to ``topk_ids [T, k]`` with ``topk_weights [T, k]`` → ``[T, H]`` in ``x.dtype``."""
        ad = adaptor()
        sorted_x, expanded_row_idx, counts = ad.moe_init_routing(x, topk_ids, layer.w13_weight.shape[0])
        rows = self.apply_experts(layer, sorted_x, counts)
        return ad.moe_finalize_routing(rows, expanded_row_idx, topk_weights).to(x.dtype)

    def process_weights(self, layer: torch.nn.Module) -> None:
        """Validate the loaded expert tensors, then replace them with the runtime layout."""
        w13 = self.loaded(layer, "w13_weight")
        if w13.dim() != 3 or w13.shape[1] % 2:
            raise self.error("w13_weight", "a 3-D [experts, 2 * intermediate, hidden] tensor", _describe(w13))
        specs = self.weight_specs(w13.shape[0], w13.shape[2], w13.shape[1] // 2)
        tensors = self.check_specs(layer, specs)
        self.validate(layer, tensors)
        runtime = self.runtime(tensors)
        self.replace_params(layer, runtime, set(specs) - set(runtime))

    def expert_tensors(self, layer: torch.nn.Module) -> list[torch.Tensor]:
        """Every per-expert runtime tensor (dim 0 = expert), for EPLB's expert copies."""
        return [getattr(layer, name) for name in self.RUNTIME]
