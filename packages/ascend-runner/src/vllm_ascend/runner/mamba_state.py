"""The V1 runner's mamba state copies under prefix caching of hybrid models (``mamba_cache_mode="align"``).

vLLM's V1 runner moves each request's recurrent state to the block its step ends in before the step
(``mamba_utils.preprocess_mamba``), as a batch of address / byte-count copies launched through its CUDA
Triton ``batch_memcpy_kernel``; here that launch is served by ``vllm_ascend.kernels.batch_memcpy`` (Triton
on NPUs, the torch reference on the reference device). Model Runner V2's fused forms of these copies are
in the V2 table (``vllm_ascend.kernels.v2.mamba_utils``).
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels import batch_memcpy


def batch_memcpy_kernel(
    src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor, BLOCK_SIZE: int
) -> None:
    """vLLM's ``batch_memcpy_kernel[(N,)](src_ptrs, dst_ptrs, sizes, BLOCK_SIZE=...)``: copy ``sizes[i]`` bytes
    from address ``src_ptrs[i]`` to ``dst_ptrs[i]`` (vLLM's tile size means nothing here)."""
    batch_memcpy(src_ptrs, dst_ptrs, sizes)


#: vLLM Triton kernels replaced on the Ascend platform (see ``Platform.register_triton_kernel_overrides``).
MAMBA_KERNEL_OVERRIDES = {"vllm.v1.worker.mamba_utils.batch_memcpy_kernel": batch_memcpy_kernel}
