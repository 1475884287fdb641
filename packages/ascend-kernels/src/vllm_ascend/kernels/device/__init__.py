"""The device ops implemented: core's op contract (``BaseDeviceAdaptor``) for every family.

``ReferenceDeviceAdaptor`` is the executable spec in plain PyTorch (what ``VLLM_ASCEND_DEVICE=reference``
runs); ``A2A3DeviceAdaptor`` and ``A5DeviceAdaptor`` map the ops onto torch_npu. They reach serving through
core's ``DEVICE_ADAPTORS`` registry (this distribution's extension registers them); overlays (310P)
extend them. Names load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports

if TYPE_CHECKING:
    from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor as A5DeviceAdaptor
    from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor as A2A3DeviceAdaptor
    from vllm_ascend.kernels.device.npu import torch_npu_module as torch_npu_module
    from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor as ReferenceDeviceAdaptor
    from vllm_ascend.kernels.device.reference import gather_paged_kv as gather_paged_kv
    from vllm_ascend.kernels.device.reference import int8_weight as int8_weight
    from vllm_ascend.kernels.device.reference import pack_int4 as pack_int4
    from vllm_ascend.kernels.device.reference import quant_matmul_int32 as quant_matmul_int32
    from vllm_ascend.kernels.device.reference import unpack_int4 as unpack_int4

_EXPORTS: dict[str, str] = {
    "A5DeviceAdaptor": "vllm_ascend.kernels.device.a5",
    "A2A3DeviceAdaptor": "vllm_ascend.kernels.device.npu",
    "torch_npu_module": "vllm_ascend.kernels.device.npu",
    "ReferenceDeviceAdaptor": "vllm_ascend.kernels.device.reference",
    "gather_paged_kv": "vllm_ascend.kernels.device.reference",
    "int8_weight": "vllm_ascend.kernels.device.reference",
    "pack_int4": "vllm_ascend.kernels.device.reference",
    "quant_matmul_int32": "vllm_ascend.kernels.device.reference",
    "unpack_int4": "vllm_ascend.kernels.device.reference",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
