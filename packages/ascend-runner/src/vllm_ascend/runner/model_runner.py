"""NPUModelRunner: vLLM's V1 GPU model runner on the NPU or the reference device.

The inherited runner builds its collaborators by name; while it does, the names are bound to
the Ascend classes (input batch + block tables, sampler, rejection sampler, KV block zeroer) and ``torch.cuda``
streams/events are mapped onto the target device. No device-type branches live here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend.kernels import kernel_warmup
from vllm_ascend.runner import device_context
from vllm_ascend.runner.input_batch import NPUInputBatch
from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.sample.rejection_sampler import AscendRejectionSampler
from vllm_ascend.runner.sample.sampler import AscendSampler

#: The vLLM names rebound while inherited code constructs collaborators.
ASCEND_COMPONENTS = {
    "InputBatch": NPUInputBatch,
    "Sampler": AscendSampler,
    "RejectionSampler": AscendRejectionSampler,
    "KVBlockZeroer": AscendKVBlockZeroer,
}


@contextmanager
def ascend_components() -> Iterator[None]:
    """Inherited runner code builds the Ascend components and uses the target's streams/events."""
    with device_context.torch_device_wrapper(), replaced_names(gpu_model_runner, ASCEND_COMPONENTS):
        yield


class NPUModelRunner(GPUModelRunner):
    """The V1 model runner for Ascend (no graph capture: the platform turns CUDA-graph modes off)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        device_context.install_accelerator_shims()
        with ascend_components():
            super().__init__(vllm_config, device)
        self.kernel_warmup_results: dict[str, bool] = {}  # item -> compiled cleanly, after warm_up()

    def may_reinitialize_input_batch(self, kv_cache_config: KVCacheConfig) -> None:
        with ascend_components():
            super().may_reinitialize_input_batch(kv_cache_config)

    def _init_kv_zero_meta(self) -> None:
        with ascend_components():
            super()._init_kv_zero_meta()

    def initialize_kv_cache(
        self,
        kv_cache_config: KVCacheConfig,
        is_profiling: bool = False,
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> None:
        with ascend_components():
            super().initialize_kv_cache(
                kv_cache_config, is_profiling, kv_cache_allocation_context=kv_cache_allocation_context
            )

    def _sync_device(self) -> None:
        device_context.synchronize()

    def warm_up(self) -> None:
        """Compile every sampling-kernel variant a step can hit (``kernel_warmup``: failures are
        logged, not raised), then one dummy forward at the largest batch of requests and one sampler
        run (fills lazy state)."""
        self.kernel_warmup_results = kernel_warmup(
            self.device,
            self.model_config.get_vocab_size(),
            (torch.float32,),  # the sampler works on float32 logits
            exclude=() if self.speculative_config is not None else ("rejection",),
        )
        num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
        _, last_hidden_states = self._dummy_run(
            num_tokens=num_reqs, skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE
        )
        self._dummy_sampler_run(hidden_states=last_hidden_states)
