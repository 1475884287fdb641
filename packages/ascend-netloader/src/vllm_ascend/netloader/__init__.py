"""vllm_ascend.netloader: load model weights from a peer (seed) over the network (lazy exports).

``import vllm_ascend.netloader`` imports neither vLLM nor the web stack; the vLLM loader class
lives in :mod:`vllm_ascend.netloader.loader` and is reached through core's ``MODEL_LOADERS``.
"""

from __future__ import annotations

from vllm_ascend.core.lazy import lazy_exports
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
