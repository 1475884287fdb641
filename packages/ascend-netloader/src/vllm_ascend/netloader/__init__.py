"""vllm_ascend.netloader: load model weights from a peer (seed) over the network (lazy exports).

``import vllm_ascend.netloader`` imports neither vLLM nor the web stack; the vLLM loader class
lives in :mod:`vllm_ascend.netloader.loader` and is reached through core's ``MODEL_LOADERS``.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ascend.netloader._version import __version__

_LAZY: dict[str, str] = {
    "ChecksumError": "vllm_ascend.netloader.client",
    "NetLoaderConfig": "vllm_ascend.netloader.config",
    "NetLoaderError": "vllm_ascend.netloader.client",
    "PeerUnavailable": "vllm_ascend.netloader.client",
    "SeedClient": "vllm_ascend.netloader.client",
    "Manifest": "vllm_ascend.netloader.manifest",
    "ManifestError": "vllm_ascend.netloader.manifest",
    "TensorEntry": "vllm_ascend.netloader.manifest",
    "FrameReader": "vllm_ascend.netloader.protocol",
    "MessageType": "vllm_ascend.netloader.protocol",
    "ProtocolError": "vllm_ascend.netloader.protocol",
    "SeedServer": "vllm_ascend.netloader.seed_server",
    "create_app": "vllm_ascend.netloader.seed_server",
    "load_checkpoint": "vllm_ascend.netloader.seed_server",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
