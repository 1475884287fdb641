"""``AscendQuantConfig``: vLLM's ``--quantization ascend`` for ModelSlim checkpoints.

vLLM finds ``quant_model_description.json`` in the model directory (``get_config_filenames``) and
hands its content to :meth:`AscendQuantConfig.from_config`; the platform also selects this method on
its own when a checkpoint carries that file. For every layer vLLM asks :meth:`get_quant_method`: the
description's type for the layer (fused layers through vLLM's packed-module mapping, prefixes through
the model's HF→vLLM mapper) picks a scheme from the scheme registry, wrapped in the method adapters of
:mod:`vllm_ascend.quant.methods`; ``FLOAT`` layers stay unquantized.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

from vllm_ascend.quant import types as qt
from vllm_ascend.quant.description import DESCRIPTION_FILE, QuantDescription, QuantDescriptionError
from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes import get_scheme_class

QUANTIZATION_METHOD = "ascend"

#: Fused modules that vLLM models of a type build but may not declare in ``packed_modules_mapping``.
MODEL_PACKED_MODULES: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek_v2": {"fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")},
    "deepseek_v3": {"fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")},
    "glm4_moe": {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")},
}

_UNSUPPORTED_GLOBALS = {
    "kv_cache_type": "an INT8 (C8) KV cache",
    "fa_quant_type": "quantized attention (FAKQuant / INT8_DYNAMIC)",
    "indexer_quant_type": "a quantized sparse-attention indexer",
}


def _current_family() -> str | None:
    from vllm_ascend.core.device.config import get_current_hardware_profile

    device_type = get_current_hardware_profile().device_type
    return None if device_type is None else device_type.value


class AscendQuantConfig(QuantizationConfig):
    """A validated ModelSlim description, answering vLLM's per-layer quant-method questions."""

    def __init__(self, description: QuantDescription) -> None:
        super().__init__()
        refused = [
            f"{key}={getattr(description, key)!r} ({what})"
            for key, what in _UNSUPPORTED_GLOBALS.items()
            if getattr(description, key) is not None
        ]
        if refused:
            raise QuantDescriptionError(
                description.source,
                [f"{item} is not supported yet by vllm-ascend-quant" for item in refused],
            )
        self.description = description
        self._tp_checked = False

    def __repr__(self) -> str:
        return f"AscendQuantConfig({self.description!r})"

    # -- vLLM's QuantizationConfig interface ----------------------------------------------------
    def get_name(self) -> str:  # type: ignore[override]
        return QUANTIZATION_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return [DESCRIPTION_FILE]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AscendQuantConfig:
        return cls(QuantDescription(config, family=_current_family()))

    def maybe_update_config(
        self, model_name: str, hf_config: Any = None, revision: str | None = None
    ) -> None:
        model_type = getattr(hf_config, "model_type", None)
        extra = MODEL_PACKED_MODULES.get(model_type or "", {})
        self.description.add_packed_modules(extra)

    def apply_vllm_mapper(self, hf_to_vllm_mapper: Any) -> None:
        """Rename the description's HF tensor names to the model's vLLM names (prefix/substring/suffix
        renames only: fused shards keep their own names and are resolved through the packed modules)."""
        mapper = dataclasses.replace(hf_to_vllm_mapper, orig_to_new_stacked={})
        renamed: dict[str, str] = {}
        for name, quant_type in self.description.tensors.items():
            new = mapper.map_name(name)
            if new is not None:
                renamed[new] = quant_type
        self.description.tensors = renamed

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm_ascend.quant.methods import AscendFusedMoEMethod, AscendLinearMethod

        if isinstance(layer, LinearBase):
            self._check_tensor_parallel()
            self.description.add_packed_modules(self.packed_modules_mapping)
            quant_type = self._layer_type(prefix, "linear")
            if quant_type == qt.FLOAT:
                return UnquantizedLinearMethod()
            scheme = get_scheme_class(quant_type, "linear")
            return AscendLinearMethod(self._build(scheme, prefix, layer))
        if isinstance(layer, RoutedExperts):
            quant_type = self._layer_type(prefix, "moe")
            if quant_type == qt.FLOAT:
                return UnquantizedFusedMoEMethod(layer.moe_config)
            scheme = get_scheme_class(quant_type, "moe")
            return AscendFusedMoEMethod(self._build(scheme, prefix, layer), layer.moe_config)
        if isinstance(layer, VocabParallelEmbedding):
            quant_type = self.description.tensors.get(f"{prefix}.weight", qt.FLOAT)
            if quant_type != qt.FLOAT:
                raise QuantLoadError(
                    f"{prefix}.weight is {quant_type} in {self.description.source}: quantized embeddings and LM "
                    "heads are not supported yet by vllm-ascend-quant; supported: FLOAT"
                )
        return None

    # -- helpers ------------------------------------------------------------------------------------
    def _build(self, scheme_cls: Any, prefix: str, layer: torch.nn.Module) -> Any:
        params_dtype = getattr(layer, "params_dtype", None) or torch.get_default_dtype()
        return scheme_cls(prefix=prefix, group_size=self.description.group_size, params_dtype=params_dtype)

    def _layer_type(self, prefix: str, layer_kind: str) -> str:
        try:
            return self.description.layer_type(prefix, layer_kind)
        except KeyError as exc:
            raise QuantLoadError(
                f"layer {prefix!r} ({layer_kind}) has no entry in {self.description.source}: {exc.args[0]}; "
                'ModelSlim lists every tensor ("FLOAT" for layers left unquantized)'
            ) from None

    def _check_tensor_parallel(self) -> None:
        if self._tp_checked:
            return
        from vllm.distributed import get_tensor_model_parallel_world_size

        self.description.check_tensor_parallel(get_tensor_model_parallel_world_size())
        self._tp_checked = True
