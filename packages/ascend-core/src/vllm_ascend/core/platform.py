"""The vLLM platform for Ascend NPUs (and the reference device on torch's cpu device)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_ascend.core.device.detection import DeviceMode, detect

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_MODE = detect().mode
_REFERENCE = _MODE is DeviceMode.REFERENCE


class NPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "npu"
    device_type = "cpu" if _REFERENCE else "npu"
    dispatch_key = "CPU" if _REFERENCE else "PrivateUse1"
    ray_device_key = "" if _REFERENCE else "NPU"
    device_control_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    dist_backend = "gloo" if _REFERENCE else "hccl"
    simple_compile_backend = "inductor" if _REFERENCE else "eager"

    @classmethod
    def is_reference(cls) -> bool:
        return _REFERENCE

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return not _REFERENCE

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "Ascend reference device (cpu)" if _REFERENCE else "Ascend NPU"

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm_ascend.core.config import init_ascend_config

        init_ascend_config(vllm_config)
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.registry import WORKERS

        load_extensions()
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            if "default" not in WORKERS:
                raise RuntimeError(
                    "vLLM Ascend needs a worker but none is registered: install the runner with "
                    "`pip install vllm-ascend-runner` (or `pip install vllm-ascend`)"
                )
            worker = WORKERS.entry("default").value
            parallel_config.worker_cls = worker if isinstance(worker, str) else f"{worker.__module__}.{worker.__qualname__}"

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)
