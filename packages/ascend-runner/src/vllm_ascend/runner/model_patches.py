"""Model patches: names in vLLM's model modules rebound to Ascend classes while the runner builds a model.

Each patch says why vLLM's model code must change on Ascend and applies only to the models that need it
(decided from the model's HF config), for the duration of ``load_model`` (the drafter is built inside it too).
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
