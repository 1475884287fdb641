"""Which ``quantization`` methods the Ascend platforms serve, and ModelSlim auto-detection.

Only ``ascend`` (ModelSlim checkpoints, provided by the ``vllm-ascend-quant`` sibling through
``QUANT_METHODS``) is served; vLLM's CUDA-kernel methods are refused by name. Without the sibling,
``quantization="ascend"`` or a checkpoint carrying ``quant_model_description.json`` is an error that
names the distribution to install — never float serving of int8 tensors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_ascend.core.config.schema import ConfigError
from vllm_ascend.core.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

METHOD = "ascend"
QUANT_DIST = "vllm-ascend-quant"
DESCRIPTION_FILE = "quant_model_description.json"
_INSTALL = "pip install 'vllm-ascend[quant]'"


def quant_method_provided() -> bool:
    """Whether an installed sibling registered the ``ascend`` quantization method."""
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import QUANT_METHODS

    load_extensions()
    return METHOD in QUANT_METHODS


def verify_quantization(quant: str) -> None:
    """Refuse every method but ``ascend``, and ``ascend`` itself when its distribution is missing."""
    if quant != METHOD:
        raise ConfigError(
            f"quantization={quant!r} is not supported by vllm-ascend (its kernels are CUDA's); supported: "
            f"{METHOD!r} (ModelSlim checkpoints, from {QUANT_DIST})"
        )
    if not quant_method_provided():
        raise ConfigError(
            f"quantization={METHOD!r} needs the `{QUANT_DIST}` distribution, which is not installed or failed "
            f"to load (see the log above): {_INSTALL}"
        )


def detect_modelslim_checkpoint(vllm_config: VllmConfig) -> None:
    """Serve a local checkpoint carrying ``quant_model_description.json`` with ``quantization="ascend"``.

    Any entry of that name (a directory, a dangling link) counts, so that it fails as a description instead of
    its int8 tensors loading as a float model; the method reads and validates the file itself."""
    model_config = vllm_config.model_config
    if model_config is None or model_config.quantization is not None:
        return
    description = Path(model_config.model) / DESCRIPTION_FILE
    if not os.path.lexists(description):
        return
    if not quant_method_provided():
        raise ConfigError(
            f"{model_config.model} is a ModelSlim-quantized checkpoint ({DESCRIPTION_FILE}); serving it needs "
            f"the `{QUANT_DIST}` distribution: {_INSTALL}"
        )
    from vllm.config import VllmConfig

    model_config.quantization = METHOD  # type: ignore[assignment]
    vllm_config.quant_config = VllmConfig._get_quantization_config(model_config, vllm_config.load_config)
    logger.info("Found %s: serving %s with quantization=%r", DESCRIPTION_FILE, model_config.model, METHOD)


def missing_method_class() -> type[Any]:
    """A vLLM ``QuantizationConfig`` standing in for ``ascend`` while its distribution is absent, so that
    vLLM reaches :func:`verify_quantization` (and its install hint) instead of "Unknown quantization
    method"; every use of it raises the same error."""
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    def refuse(*args: Any, **kwargs: Any) -> Any:
        verify_quantization(METHOD)
        raise ConfigError(f"quantization={METHOD!r} is not available")

    return type(
        "AscendQuantNotInstalled",
        (QuantizationConfig,),
        {
            "__doc__": f"``quantization={METHOD!r}`` without `{QUANT_DIST}`: refused with an install hint.",
            "__init__": refuse,
            "get_name": refuse,
            "get_supported_act_dtypes": refuse,
            "get_min_capability": classmethod(refuse),
            "get_config_filenames": staticmethod(lambda: []),
            "from_config": classmethod(refuse),
            "get_quant_method": refuse,
        },
    )
