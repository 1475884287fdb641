"""vllm_ascend.netloader: load model weights from a peer (seed) over the network (lazy exports).

``import vllm_ascend.netloader`` imports neither vLLM nor the web stack; the vLLM loader class
lives in :mod:`vllm_ascend.netloader.loader` and is reached through core's ``MODEL_LOADERS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports
from vllm_ascend.netloader._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.netloader.client import ChecksumError as ChecksumError
    from vllm_ascend.netloader.client import NetLoaderError as NetLoaderError
    from vllm_ascend.netloader.client import PeerUnavailable as PeerUnavailable
    from vllm_ascend.netloader.client import SeedClient as SeedClient
    from vllm_ascend.netloader.config import NetLoaderConfig as NetLoaderConfig
    from vllm_ascend.netloader.manifest import Manifest as Manifest
    from vllm_ascend.netloader.manifest import ManifestError as ManifestError
    from vllm_ascend.netloader.manifest import TensorEntry as TensorEntry
    from vllm_ascend.netloader.protocol import FrameReader as FrameReader
    from vllm_ascend.netloader.protocol import MessageType as MessageType
    from vllm_ascend.netloader.protocol import ProtocolError as ProtocolError
    from vllm_ascend.netloader.seed_server import SeedServer as SeedServer
    from vllm_ascend.netloader.seed_server import create_app as create_app
    from vllm_ascend.netloader.seed_server import load_checkpoint as load_checkpoint

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
