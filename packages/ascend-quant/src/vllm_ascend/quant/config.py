"""``AscendQuantConfig``: vLLM's ``--quantization ascend`` for ModelSlim checkpoints.

vLLM's ``get_quant_config`` would read the file named by ``get_config_filenames`` with a plain
``json.load`` (no size or depth bound, any top-level value); this config lists none, so vLLM builds it
bare and :meth:`AscendQuantConfig.maybe_update_config` reads ``quant_model_description.json`` through
core's bounded reader (:class:`QuantDescription`). Both that and :meth:`from_config` refuse, while vLLM
builds its config, every type or feature no scheme serves. For every layer vLLM asks
:meth:`get_quant_method`: the description's type for the layer (fused layers through vLLM's packed-module
mapping, prefixes through the model's HF→vLLM mapper) picks a scheme from the scheme registry, wrapped in
the method adapters of :mod:`vllm_ascend.quant.methods`; ``FLOAT`` layers stay unquantized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

from vllm_ascend.quant import types as qt
from vllm_ascend.quant.description import (
    DEFAULT_PACKED_MODULES,
    DESCRIPTION_FILE,
    QuantDescription,
    QuantDescriptionError,
    json_type,
    layer_of,
    listing,
)
from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes import get_scheme_class, implemented

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
    from vllm_ascend.core.sdk import get_current_hardware_profile

    device_type = get_current_hardware_profile().device_type
    return None if device_type is None else device_type.value


def _description_source(model: str, revision: str | None) -> Path:
    """A local model directory (holding the description), else the description vLLM fetched into the Hugging
    Face cache."""
    if Path(model).is_dir():
        return Path(model)
    from vllm.transformers_utils.repo_utils import try_get_local_file

    cached = try_get_local_file(model, DESCRIPTION_FILE, revision)
    if isinstance(cached, Path):
        return cached
    raise FileNotFoundError(
        f"quant description not found: {model!r} is not a local directory and the Hugging Face cache has no "
        f"{DESCRIPTION_FILE} for it (revision {revision or 'main'}); quantization='ascend' serves ModelSlim "
        "checkpoints, which carry that file"
    )


def _config_time_problems(description: QuantDescription) -> list[str]:
    """What no scheme serves: the quantized-attention globals, per-tensor attention types, layer types without a
    registered scheme for their kind (linear / MoE experts), and W4A8_DYNAMIC with a ``group_size``."""
    problems = [
        f"{key}={getattr(description, key)!r} ({what}) is not supported yet by vllm-ascend-quant"
        for key, what in _UNSUPPORTED_GLOBALS.items()
        if getattr(description, key) is not None
    ]
    layers: dict[tuple[str, str], dict[str, None]] = {}
    for name, quant_type in description.tensors.items():
        if quant_type != qt.FLOAT:
            layer, kind = layer_of(name)
            if quant_type in qt.ATTENTION_TYPES + qt.KV_CACHE_TYPES:
                layer, kind = name, "attention"
            layers.setdefault((quant_type, kind), {})[layer] = None
    for (quant_type, kind), names in layers.items():
        described = f"({len(names)}: {listing(list(names), 3)})"
        if kind == "attention":
            problems.append(
                f"{quant_type} tensors {described}: quantized attention / KV cache is not supported yet by "
                "vllm-ascend-quant"
            )
            continue
        supported = [t for t in implemented(kind) if qt.runs_on(t, description.family)]
        what = "linear layers" if kind == "linear" else "MoE experts"
        if quant_type not in supported:
            problems.append(
                f"{quant_type} {what} {described} are not supported by vllm-ascend-quant; supported for "
                f"{what}: {', '.join(supported)}"
            )
        elif quant_type == "W4A8_DYNAMIC" and description.group_size:
            problems.append(
                f"W4A8_DYNAMIC {what} {described} with group_size={description.group_size} (per-group int4 "
                "weights) are not supported; supported: per-channel W4A8_DYNAMIC (group_size 0 or absent)"
            )
    return problems


class AscendQuantConfig(QuantizationConfig):
    """A validated ModelSlim description, answering vLLM's per-layer quant-method questions.

    ``description`` None is vLLM's bare construction (``get_quant_config``); :meth:`maybe_update_config`,
    which vLLM calls next, reads the model's description.
    """

    def __init__(self, description: QuantDescription | None = None) -> None:
        super().__init__()
        self._description: QuantDescription | None = None
        self._tp_checked = False
        if description is not None:
            self._adopt(description)

    def _adopt(self, description: QuantDescription) -> None:
        problems = _config_time_problems(description)
        if problems:
            raise QuantDescriptionError(description.source, problems)
        self._description = description

    @property
    def description(self) -> QuantDescription:
        """The validated description (an error when vLLM never called :meth:`maybe_update_config`)."""
        if self._description is None:
            raise QuantLoadError(
                f"AscendQuantConfig has no quant description: build it with from_config, or let vLLM call "
                f"maybe_update_config, which reads {DESCRIPTION_FILE} from the model"
            )
        return self._description

    def __repr__(self) -> str:
        return f"AscendQuantConfig({self._description!r})"

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
        """None, so that vLLM's unbounded ``json.load`` never reads the description (see the module doc)."""
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AscendQuantConfig:
        """A config from an already parsed description object (vLLM passes a ``quantization_config`` of the
        model's ``config.json`` here)."""
        if not isinstance(config, Mapping):
            raise QuantDescriptionError(
                "<quantization config>", [f"top level must be a JSON object, got {json_type(config)}"]
            )
        return cls(QuantDescription(config, family=_current_family()))

    def maybe_update_config(
        self, model_name: str, hf_config: Any = None, revision: str | None = None
    ) -> None:
        """Read the model's description when vLLM built this config bare; add the model type's fused modules."""
        model_type = getattr(hf_config, "model_type", None)
        extra = MODEL_PACKED_MODULES.get(model_type or "", {})
        if self._description is None:
            source = _description_source(model_name, revision)
            packed = {**DEFAULT_PACKED_MODULES, **extra}
            self._adopt(QuantDescription(source, family=_current_family(), packed_modules=packed))
        else:
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
                f"layer {prefix!r} ({layer_kind}) is not fully described: {exc.args[0]}; "
                'ModelSlim lists every tensor ("FLOAT" for layers left unquantized)'
            ) from None

    def _check_tensor_parallel(self) -> None:
        if self._tp_checked:
            return
        from vllm.distributed import get_tensor_model_parallel_world_size

        self.description.check_tensor_parallel(get_tensor_model_parallel_world_size())
        self._tp_checked = True
