"""Scheme tests run on the reference device (plain PyTorch on the CPU)."""

from __future__ import annotations

import pytest


@pytest.fixture
def adaptor(monkeypatch):
    """The reference adaptor with zeroed op counts (the device caches are reset around the test)."""
    from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    ad = get_device_adaptor()
    ad.reset_counts()
    yield ad
    clear_device_caches()
