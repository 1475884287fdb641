"""vLLM's V1 mamba state copies (prefix caching of hybrid models) reach the kernels' ``batch_memcpy`` through the
worker's kernel-override table: vLLM's own host function, launching its kernel by name, moves the bytes."""

from __future__ import annotations

import torch

from vllm_ascend.runner.mamba_state import MAMBA_KERNEL_OVERRIDES, batch_memcpy_kernel
from vllm_ascend.runner.worker import NPUWorker


def test_vllm_batch_memcpy_is_served_by_the_kernels():
    from vllm.v1.worker import mamba_utils

    assert (
        NPUWorker.triton_kernel_overrides()["vllm.v1.worker.mamba_utils.batch_memcpy_kernel"]
        is batch_memcpy_kernel
    )
    assert set(MAMBA_KERNEL_OVERRIDES) == {"vllm.v1.worker.mamba_utils.batch_memcpy_kernel"}
    NPUWorker.register_triton_kernel_overrides()
    cache = torch.randn(5, 3, 8)  # five blocks of a float32 state cache
    before = cache.clone()
    nbytes = cache[0].numel() * cache.element_size()
    mamba_utils.batch_memcpy(
        torch.tensor([cache[1].data_ptr(), cache[4].data_ptr()], dtype=torch.uint64),
        torch.tensor([cache[0].data_ptr(), cache[2].data_ptr()], dtype=torch.uint64),
        torch.tensor([nbytes, nbytes // 2], dtype=torch.int32),
    )
    assert torch.equal(cache[0], before[1])
    assert torch.equal(cache[2].flatten()[:12], before[4].flatten()[:12])
    assert torch.equal(cache[2].flatten()[12:], before[2].flatten()[12:])
    assert torch.equal(cache[[1, 3, 4]], before[[1, 3, 4]])
