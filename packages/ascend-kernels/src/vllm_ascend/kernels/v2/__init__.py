"""Model Runner V2's Triton kernels on Ascend, as overrides for vLLM's kernel dispatcher.

vLLM's V2 runner (``vllm/v1/worker/gpu/``) launches its Triton kernels by name; each module here
stands in for the kernels of one V2 module (``sample_gumbel`` for ``sample/gumbel.py``) with, per
kernel, an override of vLLM's argument names (see ``_launch``), an Ascend Triton kernel in
``kernels._triton.v2`` (launch geometry from the device profile) and a torch reference. The reference
device runs the references, so V2 runs on any CPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: ``kernels.v2`` modules, each with ``OVERRIDES``: {vLLM kernel qualname: override}.
MODULES = (
    "input_batch",
    "block_table",
    "buffer_utils",
    "cp_utils",
    "structured_outputs",
    "metrics_logits",
    "mm_rope",
    "mamba_utils",
    "model_states_mamba_hybrid",
    "model_states_prompt_embeds",
    "model_states_recoverssm",
    "sample_bad_words",
    "sample_batch_shard",
    "sample_gumbel",
    "sample_logit_bias",
    "sample_logprob",
    "sample_min_p",
    "sample_output",
    "sample_penalties",
    "sample_prompt_logprob",
    "sample_thinking_budget",
    "sample_trace_replay",
    "sample_watermark",
    "spec_decode_acceptance_estimator",
    "spec_decode_dflash",
    "spec_decode_dflash2",
    "spec_decode_multi_module_mtp",
    "spec_decode_ngram",
    "spec_decode_rejection_sampler",
    "spec_decode_rejection_sampler_utils",
    "spec_decode_standalone_ar",
    "spec_decode_target_dependent_ar",
)


def v2_kernel_overrides() -> dict[str, Callable[..., Any]]:
    """Every V2 kernel override: {vLLM kernel qualname: ``override(grid, **arguments)``}."""
    table: dict[str, Callable[..., Any]] = {}
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        overlap = table.keys() & module.OVERRIDES.keys()
        if overlap:
            raise RuntimeError(f"V2 kernel overrides {sorted(overlap)} are defined twice (again in {name})")
        table.update(module.OVERRIDES)
    return table
