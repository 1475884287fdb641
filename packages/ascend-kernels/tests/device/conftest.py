"""Fixtures of the device-op tests: the current (reference) adaptor as serving resolves it."""

from __future__ import annotations

import pytest


@pytest.fixture
def adaptor(monkeypatch):
    """The current (reference) adaptor with zeroed counts, the graph ops registered; device caches reset around
    the test."""
    from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
    from vllm_ascend.kernels.device.graph_ops import register_device_ops

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    register_device_ops()
    ad = get_device_adaptor()
    ad.reset_counts()
    yield ad
    clear_device_caches()
