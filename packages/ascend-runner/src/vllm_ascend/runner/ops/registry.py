"""Register the Ascend custom ops and layers with vLLM (idempotent, once per process)."""

from __future__ import annotations

import threading

from vllm.model_executor.custom_op import CustomOp, PluggableLayer, op_registry_oot

from vllm_ascend.kernels.device.graph_ops import register_device_ops
from vllm_ascend.runner.ops.activation import AscendSiluAndMul
from vllm_ascend.runner.ops.gdn import AscendQwenGatedDeltaNetAttention
from vllm_ascend.runner.ops.layernorm import AscendRMSNorm
from vllm_ascend.runner.ops.linear import (
    AscendColumnParallelLinear,
    AscendMergedColumnParallelLinear,
    AscendParallelLMHead,
    AscendQKVParallelLinear,
    AscendReplicatedLinear,
    AscendRowParallelLinear,
    AscendVocabParallelEmbedding,
)
from vllm_ascend.runner.ops.mm_encoder_attention import AscendMMEncoderAttention
from vllm_ascend.runner.ops.moe import AscendMoERunner
from vllm_ascend.runner.ops.moe_lora import LORA_LAYERS
from vllm_ascend.runner.ops.rotary_embedding import (
    AscendApplyRotaryEmb,
    AscendMRotaryEmbedding,
    AscendRotaryEmbedding,
)

#: vLLM class name -> the Ascend replacement. CustomOps dispatch to ``forward_oot``.
CUSTOM_OPS: dict[str, type] = {
    "RMSNorm": AscendRMSNorm,
    "SiluAndMul": AscendSiluAndMul,
    "RotaryEmbedding": AscendRotaryEmbedding,
    "MRotaryEmbedding": AscendMRotaryEmbedding,
    "MMEncoderAttention": AscendMMEncoderAttention,
    "ApplyRotaryEmb": AscendApplyRotaryEmb,
}
#: vLLM class name -> the Ascend replacement for pluggable layers (replaced at instantiation).
PLUGGABLE_LAYERS: dict[str, type] = {
    "VocabParallelEmbedding": AscendVocabParallelEmbedding,
    "ParallelLMHead": AscendParallelLMHead,
    "ReplicatedLinear": AscendReplicatedLinear,
    "ColumnParallelLinear": AscendColumnParallelLinear,
    "MergedColumnParallelLinear": AscendMergedColumnParallelLinear,
    "QKVParallelLinear": AscendQKVParallelLinear,
    "RowParallelLinear": AscendRowParallelLinear,
    "MoERunner": AscendMoERunner,
    "QwenGatedDeltaNetAttention": AscendQwenGatedDeltaNetAttention,
}

_lock = threading.Lock()


def register_custom_ops() -> None:
    """Put every Ascend op/layer into vLLM's out-of-tree registry; a name already taken by ours is skipped.

    Also defines the device ops ``torch.ops.vllm_ascend.*`` the layers call, before any model is built or
    compiled. Raises ``RuntimeError`` when another plugin already registered a different class under one
    of the names. The Ascend LoRA layers (``moe_lora.LORA_LAYERS``) go ahead of vLLM's in
    ``vllm.lora.utils._all_lora_classes``: vLLM's ``from_layer`` takes the first class that accepts a layer and
    has no registration hook for LoRA layers.
    """
    register_device_ops()
    with _lock:
        _register_lora_layers()
        for table, register in (
            (CUSTOM_OPS, CustomOp.register_oot),
            (PLUGGABLE_LAYERS, PluggableLayer.register_oot),
        ):
            for name, cls in table.items():
                existing = op_registry_oot.get(name)
                if existing is cls:
                    continue
                if existing is not None:
                    raise RuntimeError(
                        f"vLLM's out-of-tree op {name!r} is already registered to {existing.__module__}."
                        f"{existing.__qualname__}; cannot register {cls.__qualname__}"
                    )
                register(cls, name=name)


def _register_lora_layers() -> None:
    import vllm.lora.utils as lora_utils

    missing = tuple(cls for cls in LORA_LAYERS if cls not in lora_utils._all_lora_classes)
    lora_utils._all_lora_classes = missing + lora_utils._all_lora_classes


def enable_custom_ops(custom_ops: list[str]) -> None:
    """Force-enable the Ascend custom ops in a compilation config's ``custom_ops`` list (in place)."""
    for name in CUSTOM_OPS:
        if f"-{name}" not in custom_ops and f"+{name}" not in custom_ops:
            custom_ops.append(f"+{name}")
