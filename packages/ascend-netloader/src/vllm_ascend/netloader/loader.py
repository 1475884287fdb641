"""``NetLoader``: vLLM model loader that takes a model's weights from a seed over the network.

Use ``load_format="netloader"`` with ``model_loader_extra_config={"source": "http://host:port",
"timeout": 30, "retries": 3}``. The seed serves the checkpoint's tensors under their checkpoint
names (``SeedServer.serving(load_checkpoint(model_dir))``); they are fed through the model's own
``load_weights`` exactly as the default loader would feed tensors read from disk. If the seed is
unreachable, keeps failing, or serves something inconsistent, the reason is logged and the
default loader loads the weights from the model's files instead.

This module imports vLLM; only registry resolution imports it (``vllm_ascend.netloader`` does not).
"""

from __future__ import annotations

import dataclasses
import time

import torch.nn as nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from vllm_ascend.core.logger import init_logger
from vllm_ascend.netloader.client import NetLoaderError, SeedClient
from vllm_ascend.netloader.config import NetLoaderConfig
from vllm_ascend.netloader.manifest import ManifestError
from vllm_ascend.netloader.protocol import ProtocolError

logger = init_logger(__name__)

FALLBACK_ERRORS = (NetLoaderError, ManifestError, ProtocolError)


class NetLoader(BaseModelLoader):
    """Load weights from a peer instance; fall back to the default loader when that fails."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.config = NetLoaderConfig.from_extra_config(load_config.model_loader_extra_config)
        self.fallback_reason: str | None = None

    def _client(self) -> SeedClient:
        return SeedClient(self.config.source, timeout=self.config.timeout, retries=self.config.retries)

    def _default_loader(self) -> DefaultModelLoader:
        return DefaultModelLoader(
            dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})
        )

    def _fall_back(self, exc: Exception) -> DefaultModelLoader:
        self.fallback_reason = f"{type(exc).__name__}: {exc}"
        logger.warning(
            "netloader: cannot load from seed %s (%s); falling back to the default loader",
            self.config.source,
            self.fallback_reason,
        )
        return self._default_loader()

    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing to download when the seed answers; otherwise the default loader downloads."""
        try:
            with self._client() as client:
                client.fetch_manifest()
        except FALLBACK_ERRORS as exc:
            self._fall_back(exc).download_model(model_config)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        started = time.perf_counter()
        received = 0
        try:
            with self._client() as client:
                manifest = client.fetch_manifest()

                def weights():
                    nonlocal received
                    for name, tensor in client.iter_tensors():
                        received += tensor.numel() * tensor.element_size()
                        yield name, tensor

                model.load_weights(weights())
        except FALLBACK_ERRORS as exc:
            self._fall_back(exc).load_weights(model, model_config)
            return
        seconds = time.perf_counter() - started
        logger.info(
            "netloader: loaded %d tensors (%.1f MiB) from %s in %.2f s (%.1f MiB/s)",
            len(manifest),
            received / 2**20,
            self.config.source,
            seconds,
            received / seconds / 2**20,
        )
