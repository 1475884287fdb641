"""Launch geometry of the Triton kernels, from the device they run on instead of CUDA assumptions.

CUDA: programs from the SM count, ``num_warps`` passed. Ascend (triton-ascend): programs from the
vector-core count (the sampling kernels are vector work; a grid much larger than the core count is
dispatched in waves), tiles bounded by the unified buffer (UB), no warps. The CPU interpreter: small
fixed counts, so that the test shapes take both the split and the unsplit paths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend.core.sdk import HardwareProfile

BACKENDS = ("cuda", "npu", "interpreter")
#: The interpreter's nominal core count (batches below it take the split paths) and its program counts.
INTERPRETER_CORES = 32
INTERPRETER_SPLIT_PROGRAMS = 8
INTERPRETER_PERSISTENT_PROGRAMS = 4


class GeometryError(ValueError):
    """Invalid launch-geometry input (the message names the field)."""


def _positive(field: str, value: Any) -> int:
    if type(value) is not int or value <= 0:
        raise GeometryError(f"{field}={value!r} must be a positive int")
    return value


@dataclass(frozen=True)
class LaunchGeometry:
    """Program counts, tile bound and launch kwargs of one device."""

    backend: str
    cores: int
    #: On-chip bytes a program's live tiles must fit in (the UB on Ascend); None: no bound.
    ub_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise GeometryError(f"backend={self.backend!r} is invalid; allowed values: {', '.join(BACKENDS)}")
        _positive("cores", self.cores)
        if self.ub_bytes is not None:
            _positive("ub_bytes", self.ub_bytes)

    @classmethod
    def for_cuda(cls, properties: Any) -> LaunchGeometry:
        """From ``torch.cuda.get_device_properties(device)`` (its ``multi_processor_count``)."""
        return cls(
            "cuda", _positive("multi_processor_count", getattr(properties, "multi_processor_count", None))
        )

    @classmethod
    def for_ascend(cls, profile: HardwareProfile, reported: tuple[int, int] | None = None) -> LaunchGeometry:
        """From the family's profile; ``reported``: ``(cube, vector)`` cores the device itself reports
        (``adaptor.core_counts()``), which take precedence over the profile's."""
        if reported is not None:
            vector = _positive("reported vector cores", reported[1])
        elif profile.vector_cores is None:
            raise GeometryError(f"profile {profile.name!r} has no vector_cores")
        else:
            vector = profile.vector_cores
        if profile.ub_bytes is None:
            raise GeometryError(f"profile {profile.name!r} has no ub_bytes")
        return cls("npu", vector, profile.ub_bytes)

    @property
    def has_warps(self) -> bool:
        return self.backend == "cuda"

    def split_programs(self, per_core: int) -> int:
        """Programs a row-split kernel aims for: ``per_core`` per SM on CUDA (latency hiding, H200-tuned),
        one per vector core on Ascend (each loops over its tiles)."""
        _positive("per_core", per_core)
        if self.backend == "interpreter":
            return INTERPRETER_SPLIT_PROGRAMS
        return per_core * self.cores if self.backend == "cuda" else self.cores

    def persistent_programs(self) -> int:
        """Programs of a grid-stride kernel: one per core."""
        return INTERPRETER_PERSISTENT_PROGRAMS if self.backend == "interpreter" else self.cores

    def max_block(self, bytes_per_element: int, live_buffers: int, cap: int) -> int:
        """The largest power of two ``<= cap`` whose ``live_buffers`` tiles of ``bytes_per_element``
        fit half the UB (the other half double-buffers the next loads); ``cap`` where there is no UB."""
        _positive("bytes_per_element", bytes_per_element)
        _positive("live_buffers", live_buffers)
        block = 1 << (_positive("cap", cap).bit_length() - 1)
        if self.ub_bytes is None:
            return block
        budget = self.ub_bytes // 2
        while block > 1 and block * bytes_per_element * live_buffers > budget:
            block //= 2
        if block * bytes_per_element * live_buffers > budget:
            raise GeometryError(
                f"live_buffers={live_buffers} x bytes_per_element={bytes_per_element} exceed half of "
                f"ub_bytes={self.ub_bytes}"
            )
        return block

    def launch(self, num_warps: int) -> dict[str, int]:
        """Launch kwargs: ``num_warps`` on CUDA only (Ascend and the interpreter have no warps)."""
        _positive("num_warps", num_warps)
        return {"num_warps": num_warps} if self.has_warps else {}


INTERPRETER = LaunchGeometry("interpreter", INTERPRETER_CORES)


@functools.cache
def geometry(device: torch.device) -> LaunchGeometry:
    """The geometry of ``device`` (cached): the interpreter on cpu, SMs on cuda, the profile and the
    adaptor's run-time core count on npu."""
    if device.type == "cpu":
        return INTERPRETER
    if device.type == "cuda":
        return LaunchGeometry.for_cuda(torch.cuda.get_device_properties(device))
    if device.type == "npu":
        from vllm_ascend.core.sdk import get_current_hardware_profile, get_device_adaptor

        reported = get_device_adaptor().core_counts(device.index or 0)
        return LaunchGeometry.for_ascend(get_current_hardware_profile(), reported)
    raise GeometryError(f"device={device.type!r} has no launch geometry; allowed values: cpu, cuda, npu")


@functools.cache
def launch(device: torch.device, num_warps: int) -> dict[str, int]:
    """``geometry(device).launch(num_warps)``: the kwargs a kernel launch on ``device`` takes (cached:
    one dict lookup per launch; callers unpack it and never change it)."""
    return geometry(device).launch(num_warps)
