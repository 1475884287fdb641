"""A stand-in CUDA device for Triton on a machine without one: cpu tensors stand for an ``sm_90``
device of 132 SMs (an H200's geometry), Triton's real launch path runs (its binder, in-memory and
on-disk caches, ``triton.compile`` for ``sm_90`` with the wheel's ``ptxas``), and the final step, loading
the cubin and launching it, is recorded instead of run. Import it in a process without
``TRITON_INTERPRET`` (this package's conftest sets it for the other tests) before any kernel runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("fake_cuda needs compiled Triton: run without TRITON_INTERPRET=1")

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

import vllm_ascend.kernels._backend as backend_choice
from vllm_ascend.kernels import _geometry

TARGET = GPUTarget("cuda", 90, 32)
SMS = 132
launches: list[str] = []  # kernel name per launch, in order
#: What a launch of the named kernel does to its arguments (kernel name -> fn(*arguments)): a test's
#: stand-in for running it, so that later host code can read the results.
EFFECTS: dict[str, Callable[..., None]] = {}


class _Utils:
    def load_binary(
        self, name: str, kernel: bytes, shared: int, device: int
    ) -> tuple[int, int, int, int, int]:
        return 0, 0, 32, 0, 1024  # module, function, registers, spills, max threads

    def unload_module(self, module: int) -> None:
        pass

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": SMS}


class _Launcher:
    def __init__(self, src: Any, metadata: Any) -> None:
        self.name = metadata.name

    def __call__(self, *args: Any) -> None:
        # grid x, y, z, stream, function, packed metadata, launch metadata, enter and exit hooks, then
        # the kernel's own arguments
        launches.append(self.name)
        effect = EFFECTS.get(self.name)
        if effect is not None:
            effect(*args[9:])


class FakeCudaDriver:
    utils = _Utils()
    launcher_cls = _Launcher

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


driver.set_active(FakeCudaDriver())
backend_choice.triton_unusable_reason = lambda device: None
_geometry.geometry = lambda device: _geometry.LaunchGeometry("cuda", SMS)
_geometry.launch.cache_clear()
