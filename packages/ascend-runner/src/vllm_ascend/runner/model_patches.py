"""Model patches: what the runner changes about vLLM's model code, each with its reason.

- :data:`MODEL_PATCHES`: names in vLLM's model modules rebound to Ascend classes, only for the models that
  need them (decided from the HF config) and only while ``load_model`` runs (the drafter is built inside it).
- :data:`CONFIG_DEFAULTS`: HF config fields vLLM's model code reads with a default that contradicts the
  architecture as HF transformers implements it; a config without the field gets the architecture's value.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from vllm.utils.import_utils import resolve_obj_by_qualname

from vllm_ascend.runner.patching import replaced_names


@dataclass(frozen=True)
class ModelPatch:
    """Rebind ``module.name`` to ``replacement`` (a qualified name) for models where ``applies(hf_config)``."""

    module: str
    name: str
    replacement: str
    applies: Callable[[Any], bool]
    why: str


MODEL_PATCHES: tuple[ModelPatch, ...] = (
    ModelPatch(
        module="vllm.model_executor.models.deepseek_v2",
        name="Indexer",
        replacement="vllm_ascend.runner.attention.mla.indexer.AscendIndexer",
        applies=lambda hf_config: hasattr(hf_config, "index_topk"),
        why=(
            "vLLM's DSA indexer quantizes to FP8 and scores through DeepGEMM/CUDA kernels into a uint8 FP8 key "
            "cache; Ascend's lightning indexer scores in the activation dtype and returns the top-k itself"
        ),
    ),
)


@dataclass(frozen=True)
class ConfigDefault:
    """``field = value`` for HF configs of ``model_types`` that lack the field."""

    model_types: tuple[str, ...]
    field: str
    value: Any
    why: str


CONFIG_DEFAULTS: tuple[ConfigDefault, ...] = (
    ConfigDefault(
        model_types=("deepseek_v3", "deepseek_v32"),
        field="scoring_func",
        value="sigmoid",
        why=(
            "DeepSeek-V3's router scores experts with a sigmoid (HF's DeepseekV3TopkRouter always does; HF's config "
            "has no such field); vLLM reads the field and falls back to softmax"
        ),
    ),
    ConfigDefault(
        model_types=("deepseek_v3", "deepseek_v32"),
        field="topk_method",
        value="noaux_tc",
        why=(
            "DeepSeek-V3's router adds e_score_correction_bias before the group-limited top-k (HF always does and "
            "saves the bias); vLLM builds the bias only for topk_method='noaux_tc', so a config without the field "
            "fails to load ('...mlp.gate.e_score_correction_bias') or routes without the bias"
        ),
    ),
    *(
        ConfigDefault(
            model_types=("deepseek_v2",),
            field=field,
            value=1,
            why=(
                "DeepSeek-V2's greedy router (HF: plain top-k of the softmax) is vLLM's grouped top-k with one group; "
                "vLLM always routes DeepSeek-V2 through grouped top-k and refuses n_group/topk_group = None, "
                "which HF's config writes"
            ),
        )
        for field in ("n_group", "topk_group")
    ),
)


def apply_config_defaults(hf_config: Any) -> list[ConfigDefault]:
    """Set the :data:`CONFIG_DEFAULTS` a config lacks (in place); returns those applied."""
    model_type = getattr(hf_config, "model_type", None)
    applied = [
        default
        for default in CONFIG_DEFAULTS
        if model_type in default.model_types and getattr(hf_config, default.field, None) is None
    ]
    for default in applied:
        setattr(hf_config, default.field, default.value)
    return applied


def applicable_patches(hf_config: Any) -> list[ModelPatch]:
    """The patches a model with this HF config (its text config for multimodal models) needs."""
    return [patch for patch in MODEL_PATCHES if patch.applies(hf_config)]


@contextmanager
def model_patches(hf_config: Any) -> Iterator[list[ModelPatch]]:
    """Apply :func:`applicable_patches` while the block runs; yields the applied patches."""
    patches = applicable_patches(hf_config)
    with ExitStack() as stack:
        for patch in patches:
            module = importlib.import_module(patch.module)
            stack.enter_context(
                replaced_names(module, {patch.name: resolve_obj_by_qualname(patch.replacement)})
            )
        yield patches
