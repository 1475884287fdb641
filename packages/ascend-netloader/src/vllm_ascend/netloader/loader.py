"""``NetLoader``: vLLM model loader that takes a model's weights from a seed over the network.

Use ``load_format="netloader"`` with ``model_loader_extra_config={"source": "http://host:port",
"timeout": 30, "retries": 3, "fallback": true}`` (plus ``token_file``/``ca_file`` for a seed that
needs a token or TLS). Before any tensor is transferred, the seed's
manifest is checked against the model (:func:`~.manifest.check_expected`: the same names, dtypes and
shapes, hence the same total bytes), by the manifest's ``kind``:

- ``checkpoint`` (``vllm-ascend netloader-seed``): the names must be exactly the tensors vLLM's
  default loader would read from the model's own safetensors files (their headers are read, not
  their data); the tensors then go through the model's ``load_weights``, as read from disk would.
- ``live`` (a running instance, :mod:`.live_seed`): the names must be exactly the new model's
  parameters and persistent buffers; each tensor is received straight into its parameter, and vLLM's
  post-load processing then runs as usual (so quantized models are refused: it would run twice).

If the seed is unreachable, keeps failing, or serves anything else, one log line says why and
vLLM's default loader loads the weights from the model's files instead; with ``fallback`` false the
load fails with that reason.

This module imports vLLM; only registry resolution imports it (``vllm_ascend.netloader`` does not).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import torch.nn as nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.netloader.client import NetLoaderError, SeedClient
from vllm_ascend.netloader.config import NetLoaderConfig
from vllm_ascend.netloader.live_seed import FALLBACK_ERRORS, load_live
from vllm_ascend.netloader.manifest import TensorSpec, check_expected
from vllm_ascend.netloader.security import read_token

logger = init_logger(__name__)

_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def checkpoint_specs(
    loader: DefaultModelLoader, model: nn.Module, model_config: ModelConfig
) -> dict[str, TensorSpec]:
    """Name → (dtype, shape) of every tensor ``loader`` would read for ``model`` from its own files.

    The same sources and file selection as :meth:`DefaultModelLoader.get_all_weights`; only the
    safetensors headers are read.
    """
    from safetensors import safe_open

    sources: Iterable[DefaultModelLoader.Source] = [
        DefaultModelLoader.Source(
            model_config.model,
            model_config.revision,
            fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
            allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
        ),
        *getattr(model, "secondary_weights", ()),
    ]
    specs: dict[str, TensorSpec] = {}
    for source in sources:
        _, files, use_safetensors, _ = loader._prepare_weights(
            source.model_or_path,
            source.subfolder,
            source.revision,
            source.fall_back_to_pt,
            source.allow_patterns_overrides,
        )
        if not use_safetensors:
            raise NetLoaderError(
                f"the files of {source.model_or_path} are not safetensors: a checkpoint seed is checked "
                "against their headers"
            )
        for file in files:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():
                    view = handle.get_slice(name)
                    dtype = view.get_dtype()
                    specs[source.prefix + name] = (
                        _SAFETENSORS_DTYPES.get(dtype, dtype),
                        tuple(view.get_shape()),
                    )
    return specs


class NetLoader(BaseModelLoader):
    """Load weights from a peer instance; fall back to the default loader when that fails."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.config = NetLoaderConfig.from_extra_config(load_config.model_loader_extra_config)
        self._token = read_token(self.config.token_file)
        self.fallback_reason: str | None = None

    def _client(self) -> SeedClient:
        return SeedClient(
            self.config.source,
            timeout=self.config.timeout,
            retries=self.config.retries,
            token=self._token,
            ca_file=self.config.ca_file,
        )

    def _default_loader(self) -> DefaultModelLoader:
        return DefaultModelLoader(
            dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})
        )

    def _fall_back(self, exc: Exception) -> DefaultModelLoader:
        self.fallback_reason = f"{type(exc).__name__}: {exc}"
        if not self.config.fallback:
            raise NetLoaderError(
                f"netloader: cannot load from seed {self.config.source} ({self.fallback_reason}); "
                "fallback is off"
            ) from exc
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
        try:
            with self._client() as client:
                manifest = client.fetch_manifest()
                if manifest.kind == "live":
                    if model_config.quantization is not None:
                        raise NetLoaderError(
                            f"a live seed cannot load a {model_config.quantization!r} model: its post-load "
                            "weights would be processed a second time"
                        )
                    load_live(client, model)
                else:
                    check_expected(manifest, checkpoint_specs(self._default_loader(), model, model_config))
                    model.load_weights(client.iter_tensors())
        except FALLBACK_ERRORS as exc:
            self._fall_back(exc).load_weights(model, model_config)
            return
        seconds = time.perf_counter() - started
        logger.info(
            "netloader: loaded %d %s tensors (%.1f MiB) from %s in %.2f s (%.1f MiB/s)",
            len(manifest),
            manifest.kind,
            manifest.total_bytes / 2**20,
            self.config.source,
            seconds,
            manifest.total_bytes / seconds / 2**20,
        )
