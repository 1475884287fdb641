"""Bridge core's model-loader registry to vLLM's ``load_format`` registry."""

from __future__ import annotations

from vllm_ascend.core.logger import init_logger
from vllm_ascend.core.registry import MODEL_LOADERS

logger = init_logger(__name__)


def register_model_loaders_with_vllm() -> list[str]:
    """Make every loader in :data:`MODEL_LOADERS` a vLLM ``load_format``; return the formats added.

    Idempotent (vLLM warns when a format is overwritten, so formats already mapped to the same
    class are skipped). A loader that fails to import is logged and skipped, like an extension.
    """
    from vllm.model_executor import model_loader

    known = model_loader._LOAD_FORMAT_TO_MODEL_LOADER
    added = []
    for name in MODEL_LOADERS.names():
        try:
            cls = MODEL_LOADERS.get(name)
        except Exception as exc:
            logger.warning(
                "Skipping model loader %r from %s: %s: %s",
                name,
                MODEL_LOADERS.owner(name),
                type(exc).__name__,
                exc,
            )
            continue
        if known.get(name) is cls:
            continue
        model_loader.register_model_loader(name)(cls)
        added.append(name)
    return added
