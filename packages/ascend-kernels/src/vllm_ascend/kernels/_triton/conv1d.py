"""Triton causal conv1d: prefill over packed sequences and the decode-time state update.

Both kernels compute a ``[BLOCK_T, BLOCK_D]`` output tile as ``bias + sum_j w[:, j] * seq[t + j]``
over the virtual sequence ``seq = concat(history (W - 1 columns), new tokens)``; the history comes
from the state line, or zeros. The new state (the last ``W - 1`` columns of ``seq``) is read before
it is written, by the same program that owns those channels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels.conv1d import check_activation


@triton.jit
def _seq_load(x_ptr, x_sd, x_st, state_ptr, s_sd, s_sw, d, q, length, d_mask, has_hist, WIDTH: tl.constexpr):
    """``seq[d, q]`` for virtual positions ``q`` (``q < 0``: history column ``W - 1 + q``)."""
    d2 = d[None, :].to(tl.int64)
    q2 = q[:, None].to(tl.int64)
    m = d_mask[None, :] & (q2 < length)
    new = tl.load(x_ptr + d2 * x_sd + q2 * x_st, mask=m & (q2 >= 0), other=0.0).to(tl.float32)
    first_hist = tl.where(has_hist, 1 - WIDTH, 0)
    old = tl.load(
        state_ptr + d2 * s_sd + (WIDTH - 1 + q2) * s_sw, mask=m & (q2 < 0) & (q2 >= first_hist), other=0.0
    )
    return tl.where(q2 >= 0, new, old.to(tl.float32))


@triton.jit
def _conv_tile(
    x_ptr,
    x_sd,
    x_st,
    state_ptr,
    s_sd,
    s_sw,
    w_ptr,
    w_sd,
    bias_ptr,
    d,
    t,
    length,
    d_mask,
    has_hist,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    WIDTH: tl.constexpr,
):
    acc = tl.zeros([t.shape[0], d.shape[0]], tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(WIDTH):
        w = tl.load(w_ptr + d * w_sd + j, mask=d_mask, other=0.0).to(tl.float32)
        acc += w[None, :] * _seq_load(
            x_ptr, x_sd, x_st, state_ptr, s_sd, s_sw, d, t + j - (WIDTH - 1), length, d_mask, has_hist, WIDTH
        )
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def _write_state(
    x_ptr,
    x_sd,
    x_st,
    state_ptr,
    s_sd,
    s_sw,
    d,
    length,
    d_mask,
    has_hist,
    WIDTH: tl.constexpr,
    WPAD: tl.constexpr,
):
    j = tl.arange(0, WPAD)
    new_state = _seq_load(
        x_ptr, x_sd, x_st, state_ptr, s_sd, s_sw, d, length - (WIDTH - 1) + j, length, d_mask, has_hist, WIDTH
    )
    ptrs = state_ptr + d[None, :].to(tl.int64) * s_sd + j[:, None] * s_sw
    tl.store(ptrs, new_state.to(state_ptr.dtype.element_ty), mask=d_mask[None, :] & (j[:, None] < WIDTH - 1))


@triton.jit
def _conv1d_fn_kernel(
    x_ptr,
    x_sd,
    x_st,
    w_ptr,
    w_sd,
    bias_ptr,
    states_ptr,
    s_sl,
    s_sd,
    s_sw,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    o_sd,
    o_st,
    dim,
    pad_slot_id,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    WIDTH: tl.constexpr,
    WPAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < dim
    start = tl.load(qsl_ptr + seq).to(tl.int64)
    length = tl.load(qsl_ptr + seq + 1).to(tl.int64) - start
    line = tl.load(idx_ptr + seq).to(tl.int64)
    has_line = line != pad_slot_id
    has_hist = has_line & (tl.load(init_ptr + seq) != 0)
    state = states_ptr + tl.where(has_line, line, 0) * s_sl
    xs = x_ptr + start * x_st
    for t0 in range(0, length, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        acc = _conv_tile(
            xs,
            x_sd,
            x_st,
            state,
            s_sd,
            s_sw,
            w_ptr,
            w_sd,
            bias_ptr,
            d,
            t,
            length,
            d_mask,
            has_hist,
            HAS_BIAS,
            SILU,
            WIDTH,
        )
        o = out_ptr + d[None, :].to(tl.int64) * o_sd + (start + t[:, None]) * o_st
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=d_mask[None, :] & (t[:, None] < length))
    if has_line:
        _write_state(xs, x_sd, x_st, state, s_sd, s_sw, d, length, d_mask, has_hist, WIDTH, WPAD)


@triton.jit
def _conv1d_update_kernel(
    x_ptr,
    x_sb,
    x_sd,
    x_st,
    w_ptr,
    w_sd,
    bias_ptr,
    states_ptr,
    s_sl,
    s_sd,
    s_sw,
    idx_ptr,
    out_ptr,
    o_sb,
    o_sd,
    o_st,
    dim,
    length,
    pad_slot_id,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    WIDTH: tl.constexpr,
    WPAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < dim
    if HAS_INDEX:
        line = tl.load(idx_ptr + b).to(tl.int64)
    else:
        line = b
    has_line = line != pad_slot_id
    state = states_ptr + tl.where(has_line, line, 0) * s_sl
    xs = x_ptr + b * x_sb
    t = tl.arange(0, BLOCK_T)
    acc = _conv_tile(
        xs,
        x_sd,
        x_st,
        state,
        s_sd,
        s_sw,
        w_ptr,
        w_sd,
        bias_ptr,
        d,
        t,
        length,
        d_mask,
        has_line,
        HAS_BIAS,
        SILU,
        WIDTH,
    )
    acc = tl.where(t[:, None] < tl.where(has_line, length, 0), acc, 0.0)
    o = out_ptr + b * o_sb + d[None, :].to(tl.int64) * o_sd + t[:, None] * o_st
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=d_mask[None, :] & (t[:, None] < length))
    if has_line:
        _write_state(xs, x_sd, x_st, state, s_sd, s_sw, d, length, d_mask, has_line, WIDTH, WPAD)


def _block_d(dim: int) -> int:
    return min(128, triton.next_power_of_2(dim))


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    pad_slot_id: int = -1,
) -> torch.Tensor:
    silu = check_activation(activation)
    weight = weight.contiguous()
    dim, width = weight.shape
    out = torch.empty_like(x)
    num_seqs = cache_indices.shape[0]
    if num_seqs == 0 or x.shape[1] == 0:
        return out
    block_d = _block_d(dim)
    _conv1d_fn_kernel[(num_seqs, triton.cdiv(dim, block_d))](
        x,
        x.stride(0),
        x.stride(1),
        weight,
        weight.stride(0),
        bias if bias is not None else weight,
        conv_states,
        conv_states.stride(0),
        conv_states.stride(1),
        conv_states.stride(2),
        query_start_loc,
        cache_indices,
        has_initial_state.to(torch.int32),
        out,
        out.stride(0),
        out.stride(1),
        dim,
        pad_slot_id,
        HAS_BIAS=bias is not None,
        SILU=silu,
        WIDTH=width,
        WPAD=triton.next_power_of_2(max(width - 1, 1)),
        BLOCK_T=16,
        BLOCK_D=block_d,
        **launch(out.device, 4),
    )
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    silu = check_activation(activation)
    weight = weight.contiguous()
    dim, width = weight.shape
    x3 = x if x.dim() == 3 else x.unsqueeze(2)
    out = torch.empty_like(x3)
    batch, _, length = x3.shape
    if batch == 0:
        return out if x.dim() == 3 else out.squeeze(2)
    block_d = _block_d(dim)
    _conv1d_update_kernel[(batch, triton.cdiv(dim, block_d))](
        x3,
        x3.stride(0),
        x3.stride(1),
        x3.stride(2),
        weight,
        weight.stride(0),
        bias if bias is not None else weight,
        conv_state,
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        conv_state_indices if conv_state_indices is not None else weight,
        out,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        dim,
        length,
        pad_slot_id,
        HAS_BIAS=bias is not None,
        SILU=silu,
        HAS_INDEX=conv_state_indices is not None,
        WIDTH=width,
        WPAD=triton.next_power_of_2(max(width - 1, 1)),
        BLOCK_T=triton.next_power_of_2(length),
        BLOCK_D=block_d,
        **launch(out.device, 4),
    )
    return out if x.dim() == 3 else out.squeeze(2)
