"""Causal depthwise conv1d of hybrid (Mamba / Gated DeltaNet) layers: prefill and decode update.

Layouts follow vLLM's: tokens are channel-first, the conv state of a sequence holds its last
``width - 1`` inputs oldest first, and sequences select their state line through an index
(``pad_slot_id`` marks a padded entry that has no state).
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

ACTIVATIONS = (None, "silu", "swish")


def check_activation(activation: str | None) -> bool:
    """Whether ``activation`` asks for SiLU; raises on an unknown name."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unsupported conv1d activation {activation!r}; expected one of {ACTIVATIONS}")
    return activation is not None


def _conv(
    seq: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, length: int, silu: bool
) -> torch.Tensor:
    """``seq``: ``[D, W - 1 + length]`` float32 → ``[D, length]`` float32."""
    width = weight.shape[1]
    w = weight.to(torch.float32)
    acc = torch.zeros(seq.shape[0], length, dtype=torch.float32, device=seq.device)
    if bias is not None:
        acc = acc + bias.to(torch.float32).unsqueeze(1)
    for j in range(width):
        acc = acc + w[:, j : j + 1] * seq[:, j : j + length]
    return acc * torch.sigmoid(acc) if silu else acc


def causal_conv1d_fn_torch(
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
    """Reference of :func:`causal_conv1d_fn`."""
    silu = check_activation(activation)
    dim, width = weight.shape
    out = torch.empty_like(x)
    starts = query_start_loc.cpu().tolist()
    lines = cache_indices.cpu().tolist()
    initial = has_initial_state.cpu().tolist()
    for i, line in enumerate(lines):
        s, e = starts[i], starts[i + 1]
        has_state = line != pad_slot_id
        if has_state and initial[i]:
            init = conv_states[line].to(torch.float32)
        else:
            init = torch.zeros(dim, width - 1, dtype=torch.float32, device=x.device)
        seq = torch.cat([init, x[:, s:e].to(torch.float32)], dim=1)
        out[:, s:e] = _conv(seq, weight, bias, e - s, silu).to(x.dtype)
        if has_state:
            conv_states[line] = seq[:, seq.shape[1] - (width - 1) :].to(conv_states.dtype)
    return out


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
    """Prefill: causal conv over packed variable-length sequences; returns a new ``[D, T]`` tensor.

    ``x``: ``[D, T]`` (channel-first, sequences packed along T; row-contiguous), ``weight``:
    ``[D, W]``, ``bias``: ``[D]`` or ``None``. ``conv_states``: ``[S, D, W - 1]``, updated in place
    with each sequence's last ``W - 1`` inputs (earlier state included when the sequence is shorter).
    ``query_start_loc``: ``[N + 1]`` int32 offsets; ``cache_indices``: ``[N]`` int32 state lines
    (``pad_slot_id``: no state read or written); ``has_initial_state``: ``[N]`` bool (else the
    history before the sequence is zeros). ``activation``: ``None``, ``"silu"`` or ``"swish"``.
    Arithmetic in float32; output in ``x.dtype``.
    """
    impl = dispatch("conv1d", "causal_conv1d_fn", causal_conv1d_fn_torch, x.device)
    return impl(
        x,
        weight,
        bias,
        conv_states,
        query_start_loc,
        cache_indices,
        has_initial_state,
        activation,
        pad_slot_id,
    )


def causal_conv1d_update_torch(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """Reference of :func:`causal_conv1d_update`."""
    silu = check_activation(activation)
    width = weight.shape[1]
    x3 = x if x.dim() == 3 else x.unsqueeze(2)
    out = torch.zeros_like(x3)
    batch, _, length = x3.shape
    lines = conv_state_indices.cpu().tolist() if conv_state_indices is not None else list(range(batch))
    for b, line in enumerate(lines):
        if line == pad_slot_id:
            continue
        seq = torch.cat([conv_state[line].to(torch.float32), x3[b].to(torch.float32)], dim=1)
        out[b] = _conv(seq, weight, bias, length, silu).to(x.dtype)
        conv_state[line] = seq[:, seq.shape[1] - (width - 1) :].to(conv_state.dtype)
    return out if x.dim() == 3 else out.squeeze(2)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """Decode: advance each sequence's conv state by ``L`` new tokens; returns a new tensor.

    ``x``: ``[B, D]`` (one token) or ``[B, D, L]`` (e.g. speculative tokens). ``conv_state``:
    ``[S, D, W - 1]``, updated in place; ``weight`` ``[D, W]``; ``bias`` ``[D]`` or ``None``.
    ``conv_state_indices``: ``[B]`` int32 state lines (``None``: line ``b`` for row ``b``); rows
    with ``pad_slot_id`` are skipped, their output is zero. Returns ``x``'s shape and dtype.
    """
    impl = dispatch("conv1d", "causal_conv1d_update", causal_conv1d_update_torch, x.device)
    return impl(x, conv_state, weight, bias, activation, conv_state_indices, pad_slot_id)
