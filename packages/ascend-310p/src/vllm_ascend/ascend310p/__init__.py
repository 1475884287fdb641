"""vllm_ascend.ascend310p: the Atlas 310P device overlay (profile refinements and device adaptor).

Core finds it through the device-overlay registry; importing this package directly is only
needed to inspect the overlay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.ascend310p._version import __version__
from vllm_ascend.core.sdk import lazy_exports

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.ascend310p.overlay import OVERLAY as OVERLAY
    from vllm_ascend.ascend310p.overlay import Ascend310PDeviceAdaptor as Ascend310PDeviceAdaptor

_LAZY = {
    "OVERLAY": "vllm_ascend.ascend310p.overlay",
    "Ascend310PDeviceAdaptor": "vllm_ascend.ascend310p.overlay",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
