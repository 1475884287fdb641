"""vllm_ascend.ascend310p: the Atlas 310P device overlay (profile refinements and device adaptor).

Core finds it through the device-overlay registry; importing this package directly is only
needed to inspect the overlay.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ascend.ascend310p._version import __version__

_LAZY = {"OVERLAY": "vllm_ascend.ascend310p.overlay", "Ascend310PDeviceAdaptor": "vllm_ascend.ascend310p.overlay"}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
