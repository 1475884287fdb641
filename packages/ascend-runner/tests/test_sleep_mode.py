"""The sleep-mode backend on the reference device's pool: levels, tags, and the graph regions' wake-up."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.sdk import get_device_adaptor
from vllm_ascend.runner.sleep_mode import AscendSleepModeBackend, register_sleep_mode_backend


@pytest.fixture
def tensors():
    pool = get_device_adaptor().memory_pool()
    made = {}
    for tag in ("weights", "kv_cache", "graph"):
        with pool.use_memory_pool(tag):
            made[tag] = torch.full((4096,), 3.0)
    assert all(pool.owns(t) for t in made.values())
    return made


def test_level_1_keeps_weights_and_graph_contents_and_wakes_at_the_same_addresses(tensors):
    backend = AscendSleepModeBackend()
    addresses = {tag: t.data_ptr() for tag, t in tensors.items()}
    backend.suspend(level=1)
    assert backend.state() == "SUSPENDED"
    backend.resume(["weights"])
    assert backend.state() == "SUSPENDED"  # the KV cache and graph regions still sleep
    assert float(tensors["weights"].sum()) == 3.0 * 4096
    backend.resume(["kv_cache"])  # graph regions wake with the KV cache
    assert backend.state() == "RUNNING"
    assert float(tensors["graph"].sum()) == 3.0 * 4096 and float(tensors["kv_cache"].abs().sum()) == 0.0
    assert {tag: t.data_ptr() for tag, t in tensors.items()} == addresses


def test_level_2_keeps_only_graph_contents(tensors):
    backend = AscendSleepModeBackend()
    backend.suspend(level=2)
    backend.resume(None)
    assert float(tensors["weights"].abs().sum()) == 0.0 and float(tensors["graph"].sum()) == 3.0 * 4096


def test_levels_and_registration():
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory

    with pytest.raises(ValueError, match="sleep level=3 is invalid; allowed: 1, 2"):
        AscendSleepModeBackend().suspend(level=3)
    register_sleep_mode_backend()
    register_sleep_mode_backend()  # once per process, whoever asks
    assert SleepModeBackendFactory.get_backend_class("ascend") is AscendSleepModeBackend
    assert (
        AscendSleepModeBackend.preserves_compiled_artifacts()
        and AscendSleepModeBackend.preserves_communicators()
    )
