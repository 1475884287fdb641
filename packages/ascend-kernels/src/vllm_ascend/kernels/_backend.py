"""Backend choice: the Triton kernel or the torch reference, decided per device.

``VLLM_ASCEND_KERNEL_BACKEND`` (read at each call, so tests may change it):

- ``auto`` (default): Triton where it can run on the tensor's device, else the torch reference.
- ``triton``: Triton or a clear :class:`KernelBackendError` naming the reason.
- ``torch``: always the reference.

Triton can run on a device when the active device family has Triton (not 310P), ``import triton`` works
and: the device is ``cuda`` (upstream
Triton); the device is ``npu`` and the installed Triton has an Ascend backend (triton-ascend);
or the device is ``cpu`` and the kernels were compiled by Triton's interpreter
(``TRITON_INTERPRET=1`` set before the kernel modules were imported).
The first fallback to the reference for a device type is logged once.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.core.sdk import init_logger

logger = init_logger(__name__)

ENV_BACKEND = "VLLM_ASCEND_KERNEL_BACKEND"


class KernelBackendError(RuntimeError):
    """The requested kernel backend cannot run on the given device."""


def requested_backend() -> str:
    """The validated value of ``VLLM_ASCEND_KERNEL_BACKEND``."""
    from vllm_ascend.core.sdk import envs

    try:
        return str(envs.VLLM_ASCEND_KERNEL_BACKEND)
    except envs.EnvError as exc:
        raise KernelBackendError(str(exc)) from None


@functools.cache
def _triton_module() -> Any:
    try:
        return importlib.import_module("triton")
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        return exc


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _has_ascend_backend(triton: Any) -> bool:
    try:
        backends = importlib.import_module("triton.backends").backends
    except Exception:
        return False
    return any(name in backends for name in ("ascend", "npu"))


def _family_without_triton() -> str | None:
    """The active device family's profile name when it has no Triton (310P: triton-ascend does not target
    it), else None; None too when the platform is not active (kernels used on their own)."""
    from vllm_ascend.core.sdk import DeviceConfigError, detect, get_current_hardware_profile

    try:
        if not detect().active:
            return None
        profile = get_current_hardware_profile()
    except DeviceConfigError:
        return None
    if profile.supports("triton"):
        return None
    return profile.name


def triton_unusable_reason(device: torch.device) -> str | None:
    """``None`` when Triton kernels can run on ``device``, else why not."""
    family = _family_without_triton()
    if family is not None:
        return f"{family} has no Triton (the torch references serve every kernel there)"
    triton = _triton_module()
    if isinstance(triton, BaseException):
        return f"triton is not importable ({type(triton).__name__}: {triton})"
    kind = device.type
    if kind == "cpu":
        if not _interpreting():
            return "device is cpu and TRITON_INTERPRET=1 is not set"
        from vllm_ascend.kernels._triton import compiled_interpreted

        if not compiled_interpreted():
            return "device is cpu but the kernels were compiled before TRITON_INTERPRET=1 was set"
        return None
    if _interpreting():
        return f"TRITON_INTERPRET=1 runs kernels on the cpu only, not on {kind}"
    if kind == "cuda":
        return None
    if kind == "npu":
        return (
            None
            if _has_ascend_backend(triton)
            else "device is npu but triton has no Ascend backend (triton-ascend)"
        )
    return f"no Triton backend for device type {kind!r}"


_logged_fallbacks: set[str] = set()


def use_triton(device: torch.device) -> bool:
    """Whether the Triton path is taken for tensors on ``device`` under the current setting."""
    choice = requested_backend()
    if choice == "torch":
        return False
    reason = triton_unusable_reason(device)
    if reason is None:
        return True
    if choice == "triton":
        raise KernelBackendError(f"{ENV_BACKEND}=triton but Triton cannot run here: {reason}")
    if device.type not in _logged_fallbacks:
        _logged_fallbacks.add(device.type)
        logger.info("vllm_ascend.kernels: using the torch reference kernels on %s (%s)", device.type, reason)
    return False


@functools.cache
def kernel_module(name: str) -> Any:
    """``vllm_ascend.kernels._triton.<name>``, imported with its kernels' cache keys settled (the same
    in every process, whatever it compiled before: see ``_cache_keys``)."""
    from vllm_ascend.kernels import _cache_keys

    module = importlib.import_module(f"vllm_ascend.kernels._triton.{name}")
    try:
        _cache_keys.settle_module(module)
    except Exception as exc:  # a Triton without the internals it relies on: keys stay Triton's own
        logger.debug("cache keys of %s not settled (%s)", module.__name__, exc)
    return module


_chosen: dict[tuple[Any, ...], bool] = {}
#: The environment settings a kernel choice depends on, and ``os.environ``'s encoded mapping on POSIX
#: (CPython updates it on every ``os.environ`` write): reading it skips ``os.environ.get``'s str encode and
#: decode, 0.7 us a variable, on every launch.
_CHOICE_ENV = (ENV_BACKEND, "TRITON_INTERPRET", "VLLM_ASCEND_DEVICE")
_ENCODED_ENV = getattr(os.environ, "_data", None)
_CHOICE_ENV_KEYS = (
    tuple(os.fsencode(name) for name in _CHOICE_ENV) if isinstance(_ENCODED_ENV, dict) else None
)


def _choice_env() -> tuple[Any, Any, Any]:
    """The current values of :data:`_CHOICE_ENV` (bytes where the encoded mapping is read)."""
    if _CHOICE_ENV_KEYS is not None:
        get = _ENCODED_ENV.get  # type: ignore[union-attr]
        backend, interpret, device = _CHOICE_ENV_KEYS
        return get(backend), get(interpret), get(device)
    return tuple(os.environ.get(name) for name in _CHOICE_ENV)  # type: ignore[return-value]


def dispatch(
    module: str, name: str, reference: Callable[..., Any], device: torch.device
) -> Callable[..., Any]:
    """Kernel ``name`` for ``device``: ``vllm_ascend.kernels._triton.<module>.<name>`` or ``reference``.

    Whether Triton serves is decided once per device, ``VLLM_ASCEND_KERNEL_BACKEND``, ``TRITON_INTERPRET`` and
    ``VLLM_ASCEND_DEVICE`` (read at each call); the platform the decision probes (the family and its Triton
    support) is taken as it was at the first launch: probing it costs microseconds to tens of microseconds a
    launch, several times a small kernel's own launch."""
    key = (device, *_choice_env())
    triton = _chosen.get(key)
    if triton is None:
        triton = _chosen[key] = use_triton(device)
    return getattr(kernel_module(module), name) if triton else reference
