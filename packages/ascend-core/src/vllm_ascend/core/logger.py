"""Loggers for the plugin: ``[vllm-ascend]`` prefix, own handler (vLLM configures only ``vllm.*``)."""

from __future__ import annotations

import logging
import sys

_ROOT = "vllm_ascend"
_FORMAT = "[vllm-ascend] %(levelname)s %(asctime)s %(name)s: %(message)s"


def _configure_root() -> logging.Logger:
    root = logging.getLogger(_ROOT)
    if not getattr(root, "_vllm_ascend_configured", False):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        root._vllm_ascend_configured = True  # type: ignore[attr-defined]
    return root


def init_logger(name: str) -> logging.Logger:
    """A logger under the ``vllm_ascend`` hierarchy for module ``name``."""
    _configure_root()
    if not name.startswith(_ROOT):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)
