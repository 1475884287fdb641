"""``without_host_pinning``: on a device without pinned host memory, vLLM's runner code that pins
unconditionally (its ``ngram_gpu`` buffers, ``Tensor.pin_memory()`` staging) runs unpinned; elsewhere
nothing changes, and everything is restored afterwards."""

from __future__ import annotations

import torch
from vllm.v1.worker import gpu_model_runner

from vllm_ascend.runner.model_runner import without_host_pinning


def test_pinning_is_left_out_only_inside_the_block_and_restored():
    real_torch = gpu_model_runner.torch
    assert "pin_memory" not in vars(torch.Tensor)
    with without_host_pinning(False):
        buffer = gpu_model_runner.torch.zeros(4, dtype=torch.long, pin_memory=True)
        assert buffer.tolist() == [0, 0, 0, 0] and not buffer.is_pinned()
        staged = buffer[:2]
        assert staged.pin_memory() is staged
        assert gpu_model_runner.torch.arange(3).tolist() == [0, 1, 2]  # the rest of torch unchanged
    assert gpu_model_runner.torch is real_torch and "pin_memory" not in vars(torch.Tensor)


def test_a_device_with_pinned_memory_keeps_vllm_code_as_it_is():
    real_torch = gpu_model_runner.torch
    with without_host_pinning(True):
        assert gpu_model_runner.torch is real_torch and "pin_memory" not in vars(torch.Tensor)
