"""Launch geometry of the Triton kernels, from the device they run on instead of CUDA assumptions.

CUDA: programs from the SM count, ``num_warps`` passed, and grid-stride kernels launched with a
program per work item (the grid vLLM's kernels use: many resident programs per SM keep enough loads in
flight). Ascend (triton-ascend): programs from the vector-core count (the sampling kernels are vector
work; a grid much larger than the core count is dispatched in waves, each program paying its setup
again), tiles bounded by the unified buffer (UB), no warps. The CPU interpreter: small fixed counts, so
that the test shapes take both the split and the unsplit paths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend.core.sdk import HardwareProfile

BACKENDS = ("cuda", "npu", "interpreter")
#: How a grid-stride kernel sizes its grid (:attr:`LaunchGeometry.grid`).
GRIDS = ("cores", "work")
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
    #: Grid of the grid-stride kernels: ``"cores"``, one program per core looping over its share of the
    #: work items (Ascend; the interpreter, whose programs run one after another), or ``"work"``, one
    #: program per item as vLLM launches them (CUDA). None: the backend's.
    grid: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise GeometryError(f"backend={self.backend!r} is invalid; allowed values: {', '.join(BACKENDS)}")
        _positive("cores", self.cores)
        if self.ub_bytes is not None:
            _positive("ub_bytes", self.ub_bytes)
        if self.grid is None:
            object.__setattr__(self, "grid", "work" if self.backend == "cuda" else "cores")
        elif self.grid not in GRIDS:
            raise GeometryError(f"grid={self.grid!r} is invalid; allowed values: {', '.join(GRIDS)}")

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
        """Programs of a grid-stride kernel on a ``"cores"`` grid: one per core."""
        return INTERPRETER_PERSISTENT_PROGRAMS if self.backend == "interpreter" else self.cores

    def programs(self, work: int) -> int:
        """Grid of a grid-stride kernel over ``work`` independent items (at least 1): one program per item
        on a ``"work"`` grid, at most :meth:`persistent_programs` on a ``"cores"`` grid."""
        if self.grid == "work":
            return max(1, work)
        return max(1, min(work, self.persistent_programs()))

    def programs_2d(self, rows: int, cols: int) -> tuple[int, int]:
        """Grid ``(p0, p1)`` of a 2-D grid-stride kernel over ``rows x cols`` independent items (program
        ``(i, j)`` takes rows ``i, i + p0, ...`` and, in each, columns ``j, j + p1, ...``): the whole
        ``(rows, cols)`` on a ``"work"`` grid (vLLM's 2-D launch), at most :meth:`persistent_programs`
        programs on a ``"cores"`` grid, the split giving the busiest program the fewest items. Cached:
        called per launch."""
        if self.grid == "work":
            return max(1, rows), max(1, cols)
        return _programs_2d(self.persistent_programs(), max(1, rows), max(1, cols))

    def column_split(self, rows: int, width: int, tile: int) -> tuple[int, int]:
        """``(chunks, chunk)``: each of ``rows`` rows of ``width`` independent columns cut into ``chunks``
        work items of ``chunk`` columns (a multiple of ``tile``; the last may be shorter). A tile each on a
        ``"work"`` grid (vLLM's per-block programs); on a ``"cores"`` grid just enough items for every
        core to get one (whole rows once ``rows`` reaches the core count). Cached: called per launch."""
        return _column_split(self.grid == "work", self.persistent_programs(), rows, width, tile)

    def max_block(self, bytes_per_element: int, live_buffers: int, cap: int) -> int:
        """The largest power of two ``<= cap`` whose ``live_buffers`` tiles of ``bytes_per_element``
        fit half the UB (the other half double-buffers the next loads); ``cap`` where there is no UB.
        Cached: called per launch."""
        return _max_block(self.ub_bytes, bytes_per_element, live_buffers, cap)

    def launch(self, num_warps: int) -> dict[str, int]:
        """Launch kwargs: ``num_warps`` on CUDA only (Ascend and the interpreter have no warps)."""
        _positive("num_warps", num_warps)
        return {"num_warps": num_warps} if self.has_warps else {}


@functools.lru_cache(maxsize=4096, typed=True)
def _column_split(per_tile: bool, programs: int, rows: int, width: int, tile: int) -> tuple[int, int]:
    tiles = -(-max(1, width) // _positive("tile", tile))
    chunks = tiles if per_tile else min(tiles, -(-programs // max(1, rows)))
    chunk = -(-tiles // chunks) * tile
    return -(-max(1, width) // chunk), chunk


@functools.lru_cache(maxsize=4096, typed=True)
def _programs_2d(programs: int, rows: int, cols: int) -> tuple[int, int]:
    best = (rows * cols + 1, 0, 0)
    for p1 in range(1, min(cols, programs) + 1):
        p0 = min(rows, programs // p1)
        # The busiest program's items; ties: more programs along the rows (fewer per-row prologues).
        best = min(best, (-(-rows // p0) * -(-cols // p1), -p0, p1))
    return -best[1], best[2]


@functools.lru_cache(maxsize=1024, typed=True)
def _max_block(ub_bytes: int | None, bytes_per_element: int, live_buffers: int, cap: int) -> int:
    _positive("bytes_per_element", bytes_per_element)
    _positive("live_buffers", live_buffers)
    block = 1 << (_positive("cap", cap).bit_length() - 1)
    if ub_bytes is None:
        return block
    budget = ub_bytes // 2
    while block > 1 and block * bytes_per_element * live_buffers > budget:
        block //= 2
    if block * bytes_per_element * live_buffers > budget:
        raise GeometryError(
            f"live_buffers={live_buffers} x bytes_per_element={bytes_per_element} exceed half of "
            f"ub_bytes={ub_bytes}"
        )
    return block


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


def programs(device: torch.device, work: int) -> int:
    """``geometry(device).programs(work)``: the grid of a grid-stride kernel over ``work`` items."""
    return geometry(device).programs(work)


@functools.cache
def launch(device: torch.device, num_warps: int) -> dict[str, int]:
    """``geometry(device).launch(num_warps)``: the kwargs a kernel launch on ``device`` takes (cached:
    one dict lookup per launch; callers unpack it and never change it)."""
    return geometry(device).launch(num_warps)
