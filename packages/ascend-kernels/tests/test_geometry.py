"""Launch geometry from the device: vector cores and the unified buffer on Ascend, SMs and warps on
CUDA, fixed counts under the interpreter; bad input names its field."""

from __future__ import annotations

import dataclasses
import types
from typing import NamedTuple

import pytest
import torch

from vllm_ascend.core import sdk as device_config
from vllm_ascend.core.device.profile import A2_PROFILE, A3_PROFILE, A5_PROFILE, REFERENCE_PROFILE
from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._geometry import INTERPRETER, GeometryError, LaunchGeometry, geometry, launch

KIB = 1024


class NpuDevice(NamedTuple):
    """A stand-in for ``torch.device("npu", i)`` (torch knows the type only once torch_npu is imported)."""

    type: str
    index: int | None


@pytest.fixture(autouse=True)
def fresh_geometry():
    geometry.cache_clear()
    launch.cache_clear()
    yield
    geometry.cache_clear()
    launch.cache_clear()


@pytest.mark.parametrize(
    ("profile", "vector_cores", "ub_bytes"),
    [(A2_PROFILE, 48, 192 * KIB), (A3_PROFILE, 48, 192 * KIB), (A5_PROFILE, 64, 256 * KIB)],
    ids=["A2", "A3", "A5"],
)
def test_ascend_geometry_comes_from_the_profile(profile, vector_cores, ub_bytes):
    g = LaunchGeometry.for_ascend(profile)
    assert (g.backend, g.cores, g.ub_bytes) == ("npu", vector_cores, ub_bytes)
    # one program per vector core, whatever the CUDA-tuned programs-per-SM factor is
    assert g.split_programs(4) == g.split_programs(1) == g.persistent_programs() == vector_cores
    assert g.launch(8) == {} and not g.has_warps  # no warps on Ascend
    # four live fp32 tiles in half the UB (the other half double-buffers): the largest power of two
    block = g.max_block(4, 4, 1 << 20)
    assert block * 4 * 4 <= ub_bytes // 2 < 2 * block * 4 * 4
    assert block == {192 * KIB: 4096, 256 * KIB: 8192}[ub_bytes]
    assert g.max_block(2, 1, 1024) == 1024  # the cap when it fits


def test_the_devices_own_core_count_wins_over_the_profile():
    g = LaunchGeometry.for_ascend(A2_PROFILE, reported=(20, 40))  # an Ascend910B4
    assert (g.cores, g.split_programs(4), g.ub_bytes) == (40, 40, 192 * KIB)


def test_npu_geometry_asks_the_adaptor_then_the_profile(monkeypatch):
    reported: dict[int, tuple[int, int] | None] = {0: (20, 40), 1: None}
    adaptor = types.SimpleNamespace(core_counts=lambda device_id=0: reported[device_id])
    monkeypatch.setattr(device_config, "get_device_adaptor", lambda: adaptor)
    monkeypatch.setattr(device_config, "get_current_hardware_profile", lambda: A5_PROFILE)
    assert geometry(NpuDevice("npu", 0)).cores == 40
    assert geometry(NpuDevice("npu", 1)) == LaunchGeometry("npu", 64, 256 * KIB)
    assert launch(NpuDevice("npu", 0), 16) == {}


def test_cuda_geometry_passes_warps_and_splits_per_sm():
    g = LaunchGeometry.for_cuda(types.SimpleNamespace(multi_processor_count=132))  # an H200
    assert (g.backend, g.cores, g.ub_bytes) == ("cuda", 132, None)
    assert g.launch(8) == {"num_warps": 8}
    assert g.split_programs(4) == 528 and g.split_programs(2) == 264 and g.persistent_programs() == 132
    assert g.max_block(4, 16, 8192) == 8192  # no on-chip budget to bound the tile


def test_the_interpreter_uses_small_fixed_counts_and_no_warps():
    g = geometry(torch.device("cpu"))
    assert g is INTERPRETER and g.cores == 32
    assert (g.split_programs(4), g.persistent_programs(), g.launch(4)) == (8, 4, {})


def test_row_splits_and_vocabulary_tiles_follow_the_geometry(monkeypatch):
    from vllm_ascend.kernels._triton import common

    dev = torch.device("cpu")
    monkeypatch.setattr(_geometry, "geometry", lambda device: LaunchGeometry.for_ascend(A2_PROFILE))
    assert common.cores(dev) == 48
    assert common.ub_cap(dev, 8192) == 4096  # 4 live fp32 tiles of 8192 overflow half of A2's 192 KiB UB
    assert common.row_split(4, 151936, 1024, dev) == (12, 13 * 1024)  # 4 rows x 12 chunks = 48 programs
    monkeypatch.setattr(_geometry, "geometry", lambda device: LaunchGeometry("cuda", 132))
    assert common.ub_cap(dev, 8192) == 8192  # the H200-tuned tile stays on CUDA
    # 528 programs wanted: 132 per row, of at least one 1024-tile each: 75 chunks of 2 tiles
    assert common.cores(dev) == 132 and common.row_split(4, 151936, 1024, dev) == (75, 2048)


def test_grid_stride_kernels_launch_a_program_per_item_on_cuda_and_per_core_elsewhere():
    h200 = LaunchGeometry.for_cuda(types.SimpleNamespace(multi_processor_count=132))
    a2 = LaunchGeometry.for_ascend(A2_PROFILE)
    assert (h200.grid, a2.grid, INTERPRETER.grid) == ("work", "cores", "cores")
    # 256 rows x 149 vocabulary blocks: vLLM's grid on CUDA, the vector cores on Ascend (4 interpreted)
    assert (h200.programs(256 * 149), a2.programs(256 * 149), INTERPRETER.programs(256 * 149)) == (
        38144,
        48,
        4,
    )
    assert h200.programs(0) == a2.programs(0) == 1 and a2.programs(5) == 5
    # vocab 151936 in 8192-tiles: a tile per item on CUDA (19 per row, vLLM's blocks); on Ascend whole
    # rows once the rows fill the 48 cores, else just enough chunks per row to give each core one
    assert h200.column_split(256, 151936, 8192) == (19, 8192)
    assert a2.column_split(256, 151936, 8192) == (1, 19 * 8192)
    assert a2.column_split(8, 151936, 8192) == (5, 4 * 8192)  # 8 rows x 5 chunks: 40 programs of 48
    assert a2.column_split(1, 100, 8192) == (1, 8192)  # a row shorter than a tile stays whole
    # the interpreter with a "work" grid: what the v2 tests' launch_grid fixture runs the kernels under
    work = dataclasses.replace(INTERPRETER, grid="work")
    assert (work.programs(37), work.column_split(2, 300, 64)) == (37, (5, 64))
    # 2-D grids (tokens x vocabulary blocks): vLLM's on CUDA; on Ascend at most the cores, split so that
    # the busiest program has the fewest items (256 x 149 on 48 cores: 16 x 3, 800 items; ideal 795)
    assert h200.programs_2d(256, 149) == (256, 149) and h200.programs_2d(0, 0) == (1, 1)
    assert a2.programs_2d(256, 149) == (16, 3)
    assert a2.programs_2d(1, 149) == (1, 38)  # 4 blocks each, as 48 programs would give
    assert a2.programs_2d(1000, 1) == (48, 1) and a2.programs_2d(0, 5) == (1, 5)
    assert INTERPRETER.programs_2d(3, 10) == (1, 4) and work.programs_2d(3, 10) == (3, 10)
    for rows, cols in ((7, 3), (256, 149), (5, 700), (48, 48), (49, 1)):
        p0, p1 = a2.programs_2d(rows, cols)
        assert p0 * p1 <= 48 and p0 <= rows and p1 <= cols


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: LaunchGeometry("rocm", 8),
            r"backend='rocm' is invalid; allowed values: cuda, npu, interpreter",
        ),
        (lambda: LaunchGeometry("npu", 0, 1024), r"cores=0 must be a positive int"),
        (lambda: LaunchGeometry("npu", 48, -1), r"ub_bytes=-1 must be a positive int"),
        (lambda: LaunchGeometry.for_cuda(object()), r"multi_processor_count=None must be a positive int"),
        (
            lambda: LaunchGeometry.for_ascend(REFERENCE_PROFILE),
            r"profile 'reference \(torch cpu\)' has no vector_cores",
        ),
        (
            lambda: LaunchGeometry.for_ascend(A2_PROFILE.with_changes(ub_bytes=None)),
            r"profile 'Atlas A2' has no ub_bytes",
        ),
        (lambda: LaunchGeometry.for_ascend(A2_PROFILE, reported=(24, 0)), r"reported vector cores=0"),
        (lambda: INTERPRETER.split_programs(0), r"per_core=0 must be a positive int"),
        (
            lambda: LaunchGeometry("cuda", 132, grid="warps"),
            r"grid='warps' is invalid; allowed values: cores, work",
        ),
        (lambda: INTERPRETER.column_split(4, 100, 0), r"tile=0 must be a positive int"),
        (lambda: INTERPRETER.launch(num_warps=2.0), r"num_warps=2.0 must be a positive int"),
        (lambda: INTERPRETER.max_block(0, 1, 64), r"bytes_per_element=0 must be a positive int"),
        (lambda: INTERPRETER.max_block(4, 0, 64), r"live_buffers=0 must be a positive int"),
        (lambda: INTERPRETER.max_block(4, 1, 0), r"cap=0 must be a positive int"),
        (
            lambda: LaunchGeometry("npu", 48, 64).max_block(8, 8, 1024),
            r"live_buffers=8 x bytes_per_element=8 exceed half of ub_bytes=64",
        ),
        (
            lambda: geometry(torch.device("meta")),
            r"device='meta' has no launch geometry; allowed values: cpu",
        ),
    ],
)
def test_bad_input_names_the_field(make, message):
    with pytest.raises(GeometryError, match=message):
        make()
