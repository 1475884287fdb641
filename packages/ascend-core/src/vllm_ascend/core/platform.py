"""The vLLM platform for Ascend NPUs (and the reference device on torch's cpu device).

On an NPU the platform drives ``torch_npu`` (device ``npu``, HCCL); with
``VLLM_ASCEND_DEVICE=reference`` it runs on torch's ``cpu`` device (gloo), eager only, and
every device op goes through the reference adaptor. The worker, model runner, attention
backend and custom ops come from the runner distribution through ``WORKERS["default"]``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_ascend.core.device.detection import DeviceMode, detect
from vllm_ascend.core.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(__name__)

_MODE = detect().mode
_REFERENCE = _MODE is DeviceMode.REFERENCE

RUNNER_DIST = "vllm-ascend-runner"
#: KV cache block sizes must be a multiple of this (the fused-infer-attention tiling).
BLOCK_SIZE_MULTIPLE = 16
#: Block size used when the user does not pick one (the NPU attention kernels' sweet spot).
DEFAULT_BLOCK_SIZE = 128
_GiB = 1 << 30


class RunnerNotInstalledError(RuntimeError):
    """No worker is registered: the runner distribution is missing or failed to load."""


def _workers() -> Any:
    """Core's WORKERS registry with the runner's ``"default"`` worker in it (loads extensions)."""
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import WORKERS

    load_extensions()
    if "default" not in WORKERS:
        raise RunnerNotInstalledError(
            "vLLM Ascend needs a worker but WORKERS has no 'default' entry: the distribution "
            f"`{RUNNER_DIST}` is not installed or failed to load (see the log above). Install it with "
            f"`pip install {RUNNER_DIST}` (or `pip install vllm-ascend`)."
        )
    return WORKERS


class NPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "cpu" if _REFERENCE else "npu"  # torch.device(f"{device_name}:{i}") is built from it
    device_type = "cpu" if _REFERENCE else "npu"
    dispatch_key = "CPU" if _REFERENCE else "PrivateUse1"
    ray_device_key = "" if _REFERENCE else "NPU"
    device_control_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    dist_backend = "gloo" if _REFERENCE else "hccl"
    simple_compile_backend = "inductor" if _REFERENCE else "eager"
    _triton_overrides_registered = False

    @classmethod
    def is_reference(cls) -> bool:
        return _REFERENCE

    def is_sleep_mode_available(self) -> bool:
        return True

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return not _REFERENCE

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        if _REFERENCE:
            return "Ascend reference device (cpu)"
        return str(torch.npu.get_device_name(device_id))  # type: ignore[attr-defined]

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        if _REFERENCE:
            import psutil

            return int(psutil.virtual_memory().total)
        return int(torch.npu.get_device_properties(device_id).total_memory)  # type: ignore[attr-defined]

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        """Bytes in use: the process's resident set on the reference device, torch_npu's peak on NPU."""
        if _REFERENCE:
            import psutil

            return float(psutil.Process(os.getpid()).memory_info().rss)
        torch.npu.reset_peak_memory_stats(device)  # type: ignore[attr-defined]
        return float(torch.npu.max_memory_allocated(device))  # type: ignore[attr-defined]

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        if not _REFERENCE:
            torch.npu.set_device(device)  # type: ignore[attr-defined]

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)
        if not _REFERENCE:
            torch.npu.manual_seed_all(seed)  # type: ignore[attr-defined]

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        allowed = (torch.float16, torch.bfloat16, torch.float32)
        if dtype not in allowed:
            raise ValueError(
                f"model dtype {dtype} is not supported on {cls.get_device_name()}; "
                f"allowed: {', '.join(str(d) for d in allowed)}"
            )

    @classmethod
    def validate_environ(cls, hard_fail: bool) -> None:
        """vLLM's unknown-variable check, with ``VLLM_ASCEND_*`` checked against core's own table."""
        from vllm import envs as vllm_envs

        from vllm_ascend.core import envs

        problems = envs.check_environment()
        problems += [
            f"Unknown vLLM environment variable detected: {name}"
            for name in sorted(os.environ)
            if name.startswith("VLLM_")
            and not name.startswith("VLLM_ASCEND_")
            and name not in vllm_envs.environment_variables
        ]
        if problems and hard_fail:
            raise ValueError("; ".join(problems))
        for problem in problems:
            logger.warning(problem)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # torch.distributed collectives over the platform's backend (gloo / hccl).
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def get_punica_wrapper(cls) -> str:
        if not _REFERENCE:
            raise NotImplementedError("LoRA is not supported on Ascend NPUs by this plugin yet")
        return "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"  # torch ops on the cpu device

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention must stay opaque to torch.compile, or the profile run (no metadata) is baked in.
        return True

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        return None

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum | None,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        """The runner's attention backend; MLA, sparse and sink attention are not provided."""
        if selected_backend is not None and selected_backend.name != "CUSTOM":
            raise ValueError(
                f"attention backend {selected_backend.name!r} is not available on {cls.get_device_name()}; "
                "allowed: CUSTOM (the Ascend attention backend)"
            )
        for flag in ("use_mla", "use_sparse", "has_sink"):
            if getattr(attn_selector_config, flag, False):
                raise ValueError(
                    f"attention with {flag}=True is not supported by the Ascend attention backend; "
                    "supported: dense decoder attention (MHA/GQA/MQA)"
                )
        worker = _workers().get("default")
        return worker.attention_backend_qualname()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """Swap vLLM's Triton slot-mapping kernel for the runner's torch implementation."""
        if cls._triton_overrides_registered:  # once per process (vLLM calls this per worker init)
            return
        from vllm.triton_utils.dispatcher import register_kernels

        worker = _workers().get("default")
        register_kernels(worker.triton_kernel_overrides())
        cls._triton_overrides_registered = True

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: VllmConfig) -> None:
        """Pick vLLM's V1 model runner (the runner's NPUModelRunner extends it) unless the user chose;
        on the reference device decide eager mode early, so custom ops default to on."""
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        if not _REFERENCE:
            return
        from vllm.config import CompilationMode, CUDAGraphMode

        vllm_config.compilation_config.mode = CompilationMode.NONE
        vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm_ascend.core.config import init_ascend_config

        init_ascend_config(vllm_config)
        workers = _workers()
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            worker = workers.entry("default").value
            parallel_config.worker_cls = (
                worker if isinstance(worker, str) else f"{worker.__module__}.{worker.__qualname__}"
            ).replace(":", ".")
        if parallel_config.enable_dbo:
            logger.warning("Dual-batch overlap is not supported on Ascend; disabled.")
            parallel_config.enable_dbo = False

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE
        if cache_config.block_size % BLOCK_SIZE_MULTIPLE != 0:
            raise ValueError(
                f"cache_config.block_size={cache_config.block_size} is not supported by the Ascend "
                f"attention backend; allowed: multiples of {BLOCK_SIZE_MULTIPLE} (e.g. 16, 64, 128)"
            )

        cls._disable_graph_capture(vllm_config)
        if _REFERENCE:
            cls._reference_overrides(vllm_config)

    @classmethod
    def _disable_graph_capture(cls, vllm_config: VllmConfig) -> None:
        """No static graphs are captured (support_static_graph_mode is False): no capture sizes."""
        from vllm.config import CUDAGraphMode

        compilation_config = vllm_config.compilation_config
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.max_cudagraph_capture_size = 0
        compilation_config.post_init_cudagraph_sizes()

    @classmethod
    def _reference_overrides(cls, vllm_config: VllmConfig) -> None:
        """The reference device runs eagerly, synchronously and sizes its KV cache in host memory."""
        from vllm.config import CompilationMode

        if vllm_config.model_config is not None:
            vllm_config.model_config.enforce_eager = True
        vllm_config.compilation_config.mode = CompilationMode.NONE
        vllm_config.scheduler_config.async_scheduling = False

        cache_config = vllm_config.cache_config
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
        if space and cache_config.kv_cache_memory_bytes is None:
            try:
                gib = float(space)
            except ValueError:
                raise ValueError(
                    f"VLLM_CPU_KVCACHE_SPACE={space!r} is invalid; allowed: a number of GiB (e.g. 1)"
                ) from None
            cache_config.kv_cache_memory_bytes = int(gib * _GiB)
