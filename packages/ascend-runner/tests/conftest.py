"""Unit tests run the runner on the reference device (set before any vLLM / plugin import)."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
