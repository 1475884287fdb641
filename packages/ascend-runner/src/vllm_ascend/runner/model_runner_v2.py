"""NPUModelRunnerV2: vLLM's Model Runner V2 (``vllm.v1.worker.gpu``) on the NPU or the reference device.

V2 is vLLM's default runner: persistent request states, an input batch built by Triton kernels, a
sampler of Triton kernels, speculators, KV-connector and pipeline hooks. On Ascend every kernel it
launches is served through vLLM's kernel dispatcher by ``vllm_ascend.kernels.v2`` (registered by the
worker: Ascend Triton on NPUs, torch references on the reference device). What this class adds is the
device: ``torch.cuda`` streams/events map onto the adaptor's while V2's code runs, model patches and HF
config defaults apply while the model loads, and warm-up / graph capture go through the adaptor.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu import cudagraph_utils as v2_cudagraph_utils
from vllm.v1.worker.gpu import model_runner as v2_model_runner
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_ascend.core.sdk import ConfigError, get_ascend_config, get_device_adaptor, get_section, init_logger
from vllm_ascend.runner import device_context
from vllm_ascend.runner.graph_wrapper import device_graph_capture
from vllm_ascend.runner.kernel_overrides import v2_kernel_table
from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer
from vllm_ascend.runner.lora_adapters import load_lora_model
from vllm_ascend.runner.model_patches import apply_config_defaults, model_patches
from vllm_ascend.runner.model_runner import check_region_split_caches
from vllm_ascend.runner.patching import replaced_names

logger = init_logger(__name__)


_VERIFICATION = "vllm.v1.worker.gpu.spec_decode"
#: The kernels V2's draft verification launches (rejection sampling, adaptive verification's estimator).
VERIFICATION_KERNELS = tuple(
    f"{_VERIFICATION}.{name}"
    for name in (
        "rejection_sampler_utils._compute_local_logits_stats_kernel",
        "rejection_sampler_utils._compute_cumulative_log_p_kernel",
        "rejection_sampler_utils._compute_local_residual_mass_kernel",
        "rejection_sampler_utils._rejection_kernel",
        "rejection_sampler_utils._resample_kernel",
        "rejection_sampler_utils._insert_resampled_kernel",
        "acceptance_estimator._accumulate_kernel",
        "acceptance_estimator._local_max_sumexp_kernel",
        "acceptance_estimator._predict_kernel",
        "acceptance_estimator._refit_kernel",
    )
)


def missing_verification_kernels() -> list[str]:
    """V2's verification kernels ``vllm_ascend.kernels.v2`` has no override for (empty when all are served)."""
    table = v2_kernel_table()
    return [name for name in VERIFICATION_KERNELS if name not in table]


def refuse_v1_only_options(vllm_config: VllmConfig) -> None:
    """Options the V1 runner serves and V2 (vLLM's speculators and rejection sampler) has no counterpart
    for are refused by name rather than ignored; so is speculative decoding while V2's verification kernels
    are not all served by this version's kernels."""
    if vllm_config.speculative_config is None:
        return
    hint = "set VLLM_USE_V2_MODEL_RUNNER=0 to serve it on the V1 model runner"
    missing = missing_verification_kernels()
    if missing:
        raise ConfigError(
            f"speculative_config (method {vllm_config.speculative_config.method!r}) on Model Runner V2 is not "
            f"supported yet by vllm-ascend: {len(missing)} of V2's draft-verification kernels have no Ascend "
            f"implementation ({', '.join(name.rsplit('.', 1)[1] for name in missing)}); {hint}"
        )
    method = get_ascend_config().rejection_sampler_config.verify_method
    if method != "strict":
        raise ConfigError(
            f"additional_config.rejection_sampler_config.verify_method = {method!r} is served by the V1 model "
            f"runner only (Model Runner V2 verifies drafts with vLLM's rejection sampler); allowed on V2: "
            f"'strict'; or {hint}"
        )
    try:
        dynamic = bool(get_section("dynamic_spec_config").enabled)
    except ConfigError:  # served by vllm-ascend[specdecode]; not installed, not given
        dynamic = False
    if dynamic:
        raise ConfigError(
            "additional_config.dynamic_spec_config.enabled = true is served by the V1 model runner only "
            f"(Model Runner V2 sizes drafts with vLLM's own acceptance estimator); disable it or {hint}"
        )


def refuse_full_graphs_without_capture(vllm_config: VllmConfig) -> None:
    """V2 captures FULL graphs itself (``torch.cuda.CUDAGraph`` under ``torch.cuda.graph``); the adaptor maps
    them where the device has such graphs (``stream_api`` entries ``CUDAGraph`` and ``graph``: torch_npu's on
    NPUs). Elsewhere (the reference device) FULL graphs on V2 are refused by name."""
    mode = vllm_config.compilation_config.cudagraph_mode
    if mode is None or not mode.has_full_cudagraphs():
        return
    api = get_device_adaptor().stream_api()
    if "CUDAGraph" in api and "graph" in api:
        return
    raise ConfigError(
        f"compilation_config.cudagraph_mode={mode.name} on Model Runner V2 is not supported yet by vllm-ascend "
        f"on {get_device_adaptor().family} (V2 captures whole-model graphs with the device's graph API, which "
        "this device does not have); allowed on V2: PIECEWISE, NONE; or set VLLM_USE_V2_MODEL_RUNNER=0 for the "
        "V1 runner's FULL graphs"
    )


class NPUModelRunnerV2(GPUModelRunner):
    """Model Runner V2 for Ascend (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        refuse_v1_only_options(vllm_config)
        refuse_full_graphs_without_capture(vllm_config)
        get_device_adaptor().install_runtime_shims()
        with device_context.torch_device_wrapper():
            super().__init__(vllm_config, device)

    def load_lora_model(
        self, model: torch.nn.Module, vllm_config: VllmConfig, device: torch.device
    ) -> torch.nn.Module:
        """vLLM's LoRA manager, with each adapter checked against the model before it loads."""
        return load_lora_model(self, model, vllm_config, device)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        configs = [self.model_config.hf_text_config]
        if self.speculative_config is not None and self.speculative_config.draft_model_config is not None:
            configs.append(self.speculative_config.draft_model_config.hf_text_config)
        for hf_config in configs:
            for default in apply_config_defaults(hf_config):
                logger.info("model config: %s=%r (%s)", default.field, default.value, default.why)
        with device_context.torch_device_wrapper(), model_patches(self.model_config.hf_text_config):
            super().load_model(*args, **kwargs)

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        with device_context.torch_device_wrapper():
            return super().execute_model(*args, **kwargs)

    def sample_tokens(self, *args: Any, **kwargs: Any) -> Any:
        with device_context.torch_device_wrapper():
            return super().sample_tokens(*args, **kwargs)

    def pool(self, *args: Any, **kwargs: Any) -> Any:
        """A pooling model's step output (the pooler, then an async copy on V2's output stream)."""
        with device_context.torch_device_wrapper():
            return super().pool(*args, **kwargs)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig, *args: Any, **kwargs: Any) -> None:
        check_region_split_caches(kv_cache_config, self.compilation_config.static_forward_context)
        with device_context.torch_device_wrapper():
            super().initialize_kv_cache(kv_cache_config, *args, **kwargs)

    def _init_kv_zero_meta(self) -> None:
        """New KV blocks are zeroed by the adaptor's block zeroing (vLLM's zeroer is a Triton kernel over raw
        segment addresses)."""
        with replaced_names(v2_model_runner, {"KVBlockZeroer": AscendKVBlockZeroer}):
            super()._init_kv_zero_meta()

    def warm_up(self) -> None:
        """One profile-sized dummy run through the model and the sampler (a pooling model: the pooler)."""
        with device_context.torch_device_wrapper():
            self.profile_run()

    def capture_model(self, *, profile_only: bool = False) -> int:
        """vLLM's capture, its ``graph_capture`` context replaced by :func:`device_graph_capture` (vLLM's asserts a
        CUDA / XPU communicator on every group of more than one rank)."""
        with (
            device_context.torch_device_wrapper(),
            replaced_names(v2_cudagraph_utils, {"graph_capture": device_graph_capture}),
        ):
            return super().capture_model(profile_only=profile_only)
