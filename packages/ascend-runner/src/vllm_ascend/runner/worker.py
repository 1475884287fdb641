"""NPUWorker: vLLM's GPU worker driving an Ascend NPU or the reference device.

Device lifecycle (``init_device``), KV cache sizing from a profile run, warm-up and graph capture
(when the compilation config asks for graphs). Sleep mode is vLLM's worker code on the platform's sleep-mode
backend (``sleep_mode.py``): with ``enable_sleep_mode`` the weights and the KV cache are allocated in the device
adaptor's tagged memory pool, whose regions sleep releases and wake-up backs again at the same addresses, so
captured graphs stay valid.
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from vllm.config import CompilationMode, VllmConfig
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.platforms import current_platform
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from vllm_ascend.core.sdk import (
    get_ascend_config,
    get_current_hardware_profile,
    get_device_adaptor,
    init_logger,
)
from vllm_ascend.kernels.device.graph_ops import trace_ops_inline
from vllm_ascend.runner.attention.mla.sparse import DSA_INDEXER_OP
from vllm_ascend.runner.block_table import TRITON_KERNEL_OVERRIDES
from vllm_ascend.runner.cpu_binding import bind_cpus
from vllm_ascend.runner.graph_wrapper import release_captured_graphs
from vllm_ascend.runner.host_threads import apply_serving_threads
from vllm_ascend.runner.kernel_overrides import (
    bind_sampling_functions,
    register_grid_kernels,
    register_kernels,
    v2_kernel_table,
)
from vllm_ascend.runner.mamba_state import MAMBA_KERNEL_OVERRIDES
from vllm_ascend.runner.model_runner import NPUModelRunner
from vllm_ascend.runner.ops.registry import enable_custom_ops, register_custom_ops
from vllm_ascend.runner.sleep_mode import register_sleep_mode_backend
from vllm_ascend.runner.spec_decode_kernels import SPEC_DECODE_KERNEL_OVERRIDES

logger = init_logger(__name__)

ATTENTION_BACKEND = "vllm_ascend.runner.attention.backend.AscendAttentionBackend"
MLA_ATTENTION_BACKEND = "vllm_ascend.runner.attention.mla.backend.AscendMLABackend"
SPARSE_MLA_ATTENTION_BACKEND = "vllm_ascend.runner.attention.mla.sparse.AscendSFABackend"
#: vLLM's MLA layer builds a prefill-backend object and asks it about fused output quantization; the Ascend
#: MLA impl computes prefill itself (``forward_mha`` on the adaptor's MLA ops) and never runs it, so vLLM's
#: plain-torch one is named (no CUDA import).
MLA_PREFILL_BACKEND = "vllm.v1.attention.backends.mla.prefill.cpu_sdpa.CPUSDPAMLAPrefillBackend"
GRAPH_WRAPPER = "vllm_ascend.runner.graph_wrapper.ACLGraphWrapper"
PASS_MANAGER = "vllm_ascend.runner.compilation.pass_manager.GraphFusionPassManager"
COMPILER = "vllm_ascend.runner.compilation.compiler.AscendCompiler"
PUNICA_WRAPPER = "vllm_ascend.runner.punica_wrapper.AscendPunicaWrapper"
#: vLLM's allocation tags that sleep mode releases (its ``workspace`` / ``runtime`` scratch stays resident).
POOL_TAGS = ("weights", "kv_cache")
#: Kernel tables handed to vLLM's dispatcher in this process ("v1", "v2").
_REGISTERED_TABLES: set[str] = set()


class NPUWorker(Worker):
    """The V1 worker for Ascend."""

    @classmethod
    def attention_backend_qualname(cls) -> str:
        return ATTENTION_BACKEND

    @classmethod
    def mla_attention_backend_qualname(cls) -> str:
        return MLA_ATTENTION_BACKEND

    @classmethod
    def sparse_mla_attention_backend_qualname(cls) -> str:
        """DeepSeek sparse attention (DSA/SFA) layers: MLA restricted to the lightning indexer's positions."""
        return SPARSE_MLA_ATTENTION_BACKEND

    @classmethod
    def mla_prefill_backend_qualname(cls) -> str:
        return MLA_PREFILL_BACKEND

    @classmethod
    def graph_splitting_ops(cls) -> tuple[str, ...]:
        """Opaque ops compiled graphs split around besides vLLM's attention ops: the DSA indexer's selection."""
        return (DSA_INDEXER_OP,)

    @classmethod
    def graph_wrapper_qualname(cls) -> str:
        return GRAPH_WRAPPER

    @classmethod
    def pass_manager_qualname(cls) -> str:
        return PASS_MANAGER

    @classmethod
    def compiler_qualname(cls) -> str:
        return COMPILER

    @classmethod
    def punica_wrapper_qualname(cls) -> str:
        """Multi-LoRA (``enable_lora``): the punica wrapper on the kernels' LoRA shrink / expand."""
        return PUNICA_WRAPPER

    @classmethod
    def triton_kernel_overrides(cls) -> dict[str, Any]:
        """The V1 runner's stand-ins for vLLM's Triton kernels (plain functions of the launch arguments)."""
        return {**TRITON_KERNEL_OVERRIDES, **SPEC_DECODE_KERNEL_OVERRIDES, **MAMBA_KERNEL_OVERRIDES}

    @classmethod
    def serves_model_runner_v2(cls) -> bool:
        """This worker builds :class:`NPUModelRunnerV2` when vLLM selects Model Runner V2."""
        return True

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """Register the V1 table with vLLM's dispatcher (and vLLM's ``apply_top_k_top_p`` with ours, see
        ``bind_sampling_functions``), and V2's (``vllm_ascend.kernels.v2``) where vLLM may select V2 for this config (``vllm_bridge.serve_model_runner_v2_in_vllm`` answered its check). Each
        table once per process: vLLM asks at every worker start, and a process may serve V1 first."""
        from vllm.config import vllm as vllm_config_module

        if "v1" not in _REGISTERED_TABLES:
            register_kernels(cls.triton_kernel_overrides())
            bind_sampling_functions()
            _REGISTERED_TABLES.add("v1")
        if "v2" not in _REGISTERED_TABLES and vllm_config_module.HAS_TRITON and cls.serves_model_runner_v2():
            register_grid_kernels(v2_kernel_table())
            _REGISTERED_TABLES.add("v2")

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        register_custom_ops()
        register_sleep_mode_backend()
        enable_custom_ops(vllm_config.compilation_config.custom_ops)
        adaptor = get_device_adaptor()
        adaptor.install_runtime_shims()
        # vLLM's DYNAMO_TRACE_ONCE compile runs none of the plugin's passes: let Inductor fuse the ops it can see
        if vllm_config.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE:
            # this engine's layers: what its forward context carries while its model is traced
            layers = vllm_config.compilation_config.static_forward_context
            trace_ops_inline(
                adaptor,
                when=lambda: (
                    is_forward_context_available() and get_forward_context().no_compile_layers is layers
                ),
            )
        else:
            trace_ops_inline(None)
        super().__init__(
            vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=is_driver_worker
        )

    # -- device ----------------------------------------------------------------------------
    def init_device(self) -> None:
        """Pick and select this rank's device, bind CPUs if configured, join the process group."""
        adaptor = get_device_adaptor()
        self.device = adaptor.torch_device(self.local_rank)
        adaptor.set_device(self.device)
        if get_ascend_config().enable_cpu_binding:
            bind_cpus(
                get_current_hardware_profile().cpu_binding,
                self.local_rank,
                self.parallel_config.local_world_size,
            )
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)
        self._init_workspace_and_model_runner()

    def _make_model_runner(self) -> Any:
        """The V2 runner when vLLM selected Model Runner V2 (``VllmConfig.use_v2_model_runner``), else V1's."""
        if self.use_v2_model_runner:
            from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2

            logger.info("Using Model Runner V2")
            return NPUModelRunnerV2(self.vllm_config, self.device)
        return NPUModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        """With sleep mode, vLLM's ``weights`` and ``kv_cache`` allocations are regions of the adaptor's pool."""
        if self.model_config.enable_sleep_mode and tag in POOL_TAGS:
            return get_device_adaptor().memory_pool().use_memory_pool(tag)
        return nullcontext()

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        """vLLM's load, then the serving thread count (``host_threads``: the device's share of the CPUs where it
        computes on the host); with sleep mode, every tensor the model (and a draft model) holds is then pool
        memory (``adopt``: tensors made by ``process_weights_after_loading`` rather than by an allocation)."""
        super().load_model(load_dummy_weights=load_dummy_weights)
        apply_serving_threads(get_device_adaptor(), self.parallel_config.local_world_size)
        if self.model_config.enable_sleep_mode:
            models = [self.model_runner.get_model(), self.get_draft_model()]
            tensors = [t for m in models if m is not None for t in [*m.parameters(), *m.buffers()]]
            moved = get_device_adaptor().memory_pool().adopt("weights", tensors)
            if moved:
                logger.info("Sleep mode: %.1f MiB of weights moved into the memory pool", moved / 2**20)

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep (the pool releases weights and KV cache); with ``rl_config.sleep_mode_extra_cleanup`` the
        captured graphs are dropped first, releasing their memory pools: each is captured again on its first
        use after waking (a graph's capture needs the KV cache awake)."""
        if not self.model_config.enable_sleep_mode:
            raise RuntimeError(
                "sleep needs the engine built with enable_sleep_mode=True (vllm serve --enable-sleep-mode): only "
                "then are the weights and the KV cache allocated where sleep can release them"
            )
        if get_ascend_config().rl_config.sleep_mode_extra_cleanup:
            dropped = release_captured_graphs(self.vllm_config)
            get_device_adaptor().empty_cache()
            logger.info(
                "Sleep mode extra cleanup: %d captured graphs dropped (captured again on use)", dropped
            )
        super().sleep(level)

    def start_weight_update(self) -> None:
        """vLLM's, refused while the weights sleep: the update would write into released device memory."""
        self._check_weights_awake("start_weight_update")
        super().start_weight_update()

    def start_draft_weight_update(self) -> None:
        self._check_weights_awake("start_draft_weight_update")
        super().start_draft_weight_update()

    def _check_weights_awake(self, call: str) -> None:
        if self.model_config.enable_sleep_mode and get_device_adaptor().memory_pool().is_asleep("weights"):
            raise RuntimeError(f"{call} while the weights are asleep: call wake_up(tags=['weights']) first")

    # -- memory and KV cache ---------------------------------------------------------------
    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` if set, else what the profile run leaves.

        Without an explicit size the budget is ``gpu_memory_utilization`` of the device memory
        (host RAM on the reference device) minus what the process uses after a profile run.
        """
        self.model_runner.profile_run()
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            logger.info("KV cache: %s GiB as configured (kv_cache_memory_bytes)", format_gib(explicit))
            return int(explicit)
        gc.collect()
        total = current_platform.get_device_total_memory(self.local_rank)
        used = current_platform.get_current_memory_usage(self.device)
        budget = int(total * self.cache_config.gpu_memory_utilization - used)
        if budget <= 0:
            raise ValueError(
                f"no memory left for the KV cache: gpu_memory_utilization={self.cache_config.gpu_memory_utilization} "
                f"of {format_gib(total)} GiB is below the {format_gib(used)} GiB in use; raise "
                "gpu_memory_utilization or set kv_cache_memory_bytes (VLLM_CPU_KVCACHE_SPACE on the reference device)"
            )
        logger.info("KV cache: %s GiB (profiled)", format_gib(budget))
        return budget

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        """Record the KV block counts chosen by the engine."""
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.initialize_cache(kv_cache_config.num_blocks, 0)
        super().initialize_from_config(kv_cache_config)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Warm up (one dummy forward + sampler run), capture the configured graphs; then reset the seed."""
        self.model_runner.warm_up()
        self.model_runner.capture_model()
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )
