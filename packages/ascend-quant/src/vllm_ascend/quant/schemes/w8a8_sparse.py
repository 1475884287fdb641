"""W8A8S and W8A8SC: the Atlas 310P's sparse static W8A8 linear schemes.

W8A8S (ModelSlim's sparse quantization): static W8A8 whose int8 weights are sparsified. The checkpoint holds
``weight`` int8 ``[out, in]``, ``input_scale`` / ``input_offset`` ``[1]``, ``deq_scale`` ``[out]`` (int64 carrying
float32 bits, or float32) and ``quant_bias`` int32 ``[out]`` — no ``weight_scale`` / ``weight_offset``: ModelSlim
folds the weight scale into ``deq_scale`` and the float bias and activation offset into ``quant_bias``. The
arithmetic is static W8A8's (:class:`~vllm_ascend.quant.schemes.w8a8.W8A8Linear`).

W8A8SC (sparse-compressed): a W8A8S layer whose weight went through ModelSlim's compressor — ``weight`` int8
``[c]``, ``index`` int8 and ``info`` int64 ``[5]`` instead of the ``[out, in]`` weight (the encoding:
:mod:`vllm_ascend.quant.compress`); the other tensors are W8A8S's. The weight is decompressed once after loading
(lossless) and runs as W8A8S; a fused layer's shards each carry their own compressed tensors. Compressed
weights cannot be split over tensor-parallel ranks.

Both need the profile's ``SPARSE_WEIGHT`` capability (the 310P family; the reference device emulating it) and
are refused at layer creation elsewhere, naming the capability and the family.
"""

from __future__ import annotations

import torch

from vllm_ascend.core.sdk import HardwareCapability, get_current_hardware_profile
from vllm_ascend.quant import types as qt
from vllm_ascend.quant.compress import INFO_FIELDS, CompressedFormatError, decompress_weight, split_shards
from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes.base import TensorSpec
from vllm_ascend.quant.schemes.registry import register_scheme
from vllm_ascend.quant.schemes.w8a8 import W8A8Linear


def require_sparse_weight(prefix: str, quant_type: str) -> None:
    """Refuse ``quant_type`` on a profile without ``SPARSE_WEIGHT`` (the capability's reader)."""
    profile = get_current_hardware_profile()
    if HardwareCapability.SPARSE_WEIGHT in profile.capabilities:
        return
    family = profile.device_type.value if profile.device_type is not None else "none (reference device)"
    raise QuantLoadError(
        f"layer {prefix!r}: {quant_type} (sparse int8 weights) needs the hardware capability "
        f"{HardwareCapability.SPARSE_WEIGHT.value!r}, which {profile.name} (family {family}) lacks; "
        f"{quant_type} is served on the {qt.family_requirement(quant_type)} family only"
    )


@register_scheme("W8A8S", "linear")
class W8A8SLinear(W8A8Linear):
    """Static W8A8 with sparsified int8 weights and no weight scale/offset tensors (310P)."""

    def __init__(self, *, prefix: str, group_size: int | None, params_dtype: torch.dtype) -> None:
        super().__init__(prefix=prefix, group_size=group_size, params_dtype=params_dtype)
        require_sparse_weight(prefix, self.quant_type)

    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """``weight`` int8 ``[out, in]``, ``input_scale`` / ``input_offset`` ``[1]``, ``deq_scale`` / ``quant_bias`` ``[out]``."""
        specs = super().weight_specs(output_size, input_size)
        del specs["weight_scale"], specs["weight_offset"]
        return specs

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """The activation and ``deq_scale`` checks of static W8A8 (no weight offsets to check)."""
        self.validate_activation(layer, tensors)


@register_scheme("W8A8SC", "linear")
class W8A8SCLinear(W8A8SLinear):
    """W8A8S with the weight compressed by ModelSlim's compressor; decompressed once after loading (310P)."""

    TENSOR_PARALLEL_UNSUPPORTED = (
        "its compressed weight is one encoded blob per layer shard and cannot be split over ranks"
    )

    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """W8A8S's tensors with ``weight`` int8 ``[c]``, ``index`` int8 and ``info`` int64 (``blob``: sized by the checkpoint)."""
        specs = super().weight_specs(output_size, input_size)
        specs["weight"] = TensorSpec((0,), torch.int8, "blob")
        specs["index"] = TensorSpec((0,), torch.int8, "blob")
        specs["info"] = TensorSpec((0,), torch.int64, "blob")
        return specs

    def layer_sizes(self, layer: torch.nn.Module) -> tuple[int, int]:
        """``out`` = ``deq_scale``'s length; ``in`` from the shards' ``info`` records (all must agree)."""
        info = self.loaded(layer, "info")
        if (
            info.dtype != torch.int64
            or info.dim() != 1
            or info.numel() == 0
            or info.numel() % len(INFO_FIELDS)
        ):
            raise self.error(
                "info",
                f"int64 with {len(INFO_FIELDS)} values ({', '.join(INFO_FIELDS)}) per fused shard",
                f"{info.dtype} {tuple(info.shape)}",
            )
        cols = {int(c) for c in info.reshape(-1, len(INFO_FIELDS))[:, 3]}
        if len(cols) != 1:
            raise self.error(
                "info", "one input size (info[3]) shared by every fused shard", f"{sorted(cols)}"
            )
        return self.loaded(layer, "deq_scale").numel(), cols.pop()

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """W8A8S's checks, then every shard decompressed; ``tensors["weight"]`` becomes the int8 ``[out, in]`` weight."""
        super().validate(layer, tensors)
        out_features = tensors["deq_scale"].numel()
        try:
            shards = split_shards(tensors["weight"], tensors["index"], tensors["info"])
            weight = torch.cat([decompress_weight(s.weight, s.index, s.info) for s in shards])
        except CompressedFormatError as exc:
            raise self.error(exc.field, exc.expected, exc.got) from None
        if weight.shape[0] != out_features:
            raise self.error(
                "info",
                f"shard rows (info[2]) summing to the layer's {out_features} output features",
                f"{[int(r) for r in tensors['info'].reshape(-1, len(INFO_FIELDS))[:, 2]]}",
            )
        tensors["weight"] = weight
