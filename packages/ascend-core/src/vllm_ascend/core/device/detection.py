"""Decide, without importing torch or torch_npu, whether the platform should activate.

This runs inside vLLM's platform detection (``register()``), in every process, so it only
looks at the environment, installed module specs and device nodes.
"""

from __future__ import annotations

import enum
import glob
import importlib.util
from dataclasses import dataclass

from vllm_ascend.core import envs


class DeviceMode(enum.StrEnum):
    NPU = "npu"
    REFERENCE = "reference"
    NONE = "none"


@dataclass(frozen=True)
class Detection:
    """The outcome of detection: the mode and, when the platform cannot activate, why."""

    requested: str
    mode: DeviceMode
    reason: str

    @property
    def active(self) -> bool:
        return self.mode is not DeviceMode.NONE

    @property
    def explicitly_requested(self) -> bool:
        return self.requested in ("npu", "reference")


def npu_usable() -> tuple[bool, str]:
    """An Ascend NPU is usable when torch_npu is installed and a davinci device node exists."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    if not glob.glob("/dev/davinci[0-9]*"):
        return False, "no /dev/davinci* device node (no Ascend NPU visible)"
    return True, "Ascend NPU visible and torch_npu installed"


def detect() -> Detection:
    """Resolve ``VLLM_ASCEND_DEVICE`` (auto/npu/reference/off) against what the machine has.

    Raises :class:`vllm_ascend.core.envs.EnvError` for an invalid value.
    """
    requested = envs.VLLM_ASCEND_DEVICE
    if requested == "off":
        return Detection(requested, DeviceMode.NONE, "VLLM_ASCEND_DEVICE=off")
    if requested == "reference":
        return Detection(requested, DeviceMode.REFERENCE, "VLLM_ASCEND_DEVICE=reference")
    usable, why = npu_usable()
    if usable:
        return Detection(requested, DeviceMode.NPU, why)
    if requested == "npu":
        return Detection(requested, DeviceMode.NONE, f"VLLM_ASCEND_DEVICE=npu but {why}")
    return Detection(requested, DeviceMode.NONE, f"{why}; set VLLM_ASCEND_DEVICE=reference to run on the CPU")
