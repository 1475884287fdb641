"""The host CPU the reference device runs on: its ISA, and the vLLM kernel library chosen for it.

vLLM's CPU wheel ships one kernel library per x86 ISA level (``vllm._C`` is the AVX-512 + BF16 build,
``vllm._C_AVX512`` and ``vllm._C_AVX2`` the narrower ones); importing one built for a wider ISA than the
host's kills the process with SIGILL. The reference device therefore never picks a library itself: it
asks vLLM's own CPU platform (:func:`import_host_kernels`), so the choice cannot drift from vLLM's. What
that choice is can be found without loading anything (:func:`selected_kernel_library`), and what a
process has loaded is read from its memory map (:func:`loaded_kernel_libraries`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: Module names of vLLM's compiled CPU kernel libraries start with this.
KERNEL_MODULE_PREFIX = "vllm._C"
#: vLLM's CPU platform ignores an ImportError carrying this text (its ISA variants register their ops and
#: then fail Python's module-init lookup); the probe raises it so that vLLM logs nothing.
_IGNORED_BY_VLLM = "dynamic module does not define module export function"


@dataclass(frozen=True)
class HostIsa:
    """What the host CPU offers, as torch (and so vLLM's CPU platform) detects it."""

    arch: str
    avx512: bool
    avx512_bf16: bool
    amx: bool
    torch_capability: str

    def describe(self) -> str:
        """One line, e.g. ``x86_64: AVX2, no AVX-512 (torch kernels: AVX2)``."""
        if self.arch in ("x86_64", "amd64", "i686", "x86"):
            if not self.avx512:
                level = (
                    "AVX2, no AVX-512" if self.torch_capability.upper().startswith("AVX2") else "no AVX-512"
                )
            else:
                level = "AVX-512" + (" + BF16" if self.avx512_bf16 else ", no AVX-512 BF16")
                level += " + AMX" if self.amx else ""
        else:
            level = "no x86 ISA levels"
        return f"{self.arch}: {level} (torch kernels: {self.torch_capability})"


def host_isa() -> HostIsa:
    """The host's ISA from torch's CPU feature detection (the functions vLLM's CPU platform reads)."""
    import torch

    cpu = torch.cpu

    def flag(name: str) -> bool:
        probe = getattr(cpu, name, None)
        return bool(probe()) if callable(probe) else False

    return HostIsa(
        arch=platform.machine().lower() or "unknown",
        avx512=flag("_is_avx512_supported"),
        avx512_bf16=flag("_is_avx512_bf16_supported"),
        amx=flag("_is_amx_tile_supported"),
        torch_capability=str(torch.backends.cpu.get_cpu_capability()),
    )


def import_host_kernels() -> None:
    """Load vLLM's kernel library for this host, chosen by vLLM's CPU platform."""
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()


class _KernelImportProbe(importlib.abc.MetaPathFinder):
    """Records which ``vllm._C*`` module is asked for and refuses it, so nothing is loaded."""

    def __init__(self) -> None:
        self.requested: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _is_kernel_module(fullname):
            self.requested.append(fullname)
            raise ImportError(f"{_IGNORED_BY_VLLM} (kernel selection probe: {fullname} not loaded)")
        return None


def selected_kernel_library(import_kernels: Callable[[], None] = import_host_kernels) -> str | None:
    """The ``vllm._C*`` module ``import_kernels`` imports on this host, found without loading it (``None``
    when it imports none). Kernel modules loaded already are hidden from ``sys.modules`` meanwhile, so
    that the import reaches the probe instead of being answered from there."""
    probe = _KernelImportProbe()
    loaded = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_kernel_module(name)}
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    sys.meta_path.insert(0, probe)
    vllm_logger.setLevel(logging.CRITICAL)
    try:
        import_kernels()
    finally:
        sys.meta_path.remove(probe)
        vllm_logger.setLevel(level)
        sys.modules.update(loaded)
    return probe.requested[0] if probe.requested else None


def _is_kernel_module(name: str) -> bool:
    """``vllm._C``, ``vllm._C_AVX2``, ...: a top-level kernel module of the vllm package."""
    return name.startswith(KERNEL_MODULE_PREFIX) and "." not in name[len("vllm.") :]


def kernel_library_file(module: str) -> str | None:
    """The shared-library file that holds ``module`` (without loading it), or ``None``."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def loaded_kernel_libraries(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """The vLLM kernel library files mapped into this process (Linux; empty where there is no map)."""
    try:
        text = maps.read_text()
    except OSError:
        return []
    found: list[str] = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = Path(fields[5])
        if path.parent.name == "vllm" and path.name.startswith("_C") and path.suffix == ".so":
            if str(path) not in found:
                found.append(str(path))
    return found
