"""Triton :func:`vllm_ascend.kernels.fused_gdn_gating`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens"])
def _gdn_gating_kernel(
    a_log_ptr,
    a_ptr,
    b_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    num_tokens,
    heads,
    a_stride,
    b_stride,
    softplus_beta,
    softplus_threshold,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (t[:, None] < num_tokens) & (h[None, :] < heads)
    hm = h < heads
    a_log = tl.load(a_log_ptr + h, mask=hm, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h, mask=hm, other=0.0).to(tl.float32)
    rows = t[:, None].to(tl.int64)
    x = tl.load(a_ptr + rows * a_stride + h[None, :], mask=mask, other=0.0).to(tl.float32) + dt_bias[None, :]
    bx = softplus_beta * x
    soft = tl.where(
        bx <= softplus_threshold, tl.log(1.0 + tl.exp(tl.minimum(bx, softplus_threshold))) / softplus_beta, x
    )
    out = rows * heads + h[None, :]
    tl.store(g_ptr + out, -tl.exp(a_log)[None, :] * soft, mask=mask)
    b = tl.load(b_ptr + rows * b_stride + h[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(beta_ptr + out, tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=mask)


def fused_gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("fused_gdn_gating needs a and b with contiguous rows")
    num_tokens, heads = a.shape
    g = torch.empty(1, num_tokens, heads, dtype=torch.float32, device=a.device)
    beta = torch.empty(1, num_tokens, heads, dtype=b.dtype, device=a.device)
    if num_tokens == 0:
        return g, beta
    block_h = triton.next_power_of_2(heads)
    block_t = max(1, min(64, 2048 // block_h))
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(heads, block_h))
    _gdn_gating_kernel[grid](
        A_log,
        a,
        b,
        dt_bias,
        g,
        beta,
        num_tokens,
        heads,
        a.stride(0),
        b.stride(0),
        float(softplus_beta),
        float(softplus_threshold),
        BLOCK_T=block_t,
        BLOCK_H=block_h,
    )
    return g, beta
