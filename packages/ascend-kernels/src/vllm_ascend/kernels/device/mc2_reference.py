"""MC2 dispatch and combine in plain PyTorch over ``torch.distributed`` (the reference device's MoE comm).

The NPU's ``npu_moe_distribute_dispatch``/``combine`` write token copies into windows sized for the
capacity: every rank may send at most ``global_bs / W`` tokens, so each sender owns, on each peer, a window
of ``global_bs / W * min(L, k)`` rows (a token sends at most ``min(L, k)`` copies to one rank of ``L``
experts). Here each window is a fixed-size slice of one ``all_to_all_single``, so the same token copies
land in the same capacity-sized buffers as on the device; padding tokens (``active_mask`` false) are not
sent. Whole windows travel here (their unfilled rows too), so the bytes this moves are an upper bound of
the device kernel's, which writes the rows it fills into its peers' windows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from vllm_ascend.core.sdk import DeviceOpError, MoeDispatch


def _check(expert_ids: torch.Tensor, world: int, num_experts: int, global_bs: int) -> tuple[int, int]:
    """``(L, window rows)`` after checking the call against the capacity contract."""
    if expert_ids.dim() != 2:
        raise DeviceOpError(f"expert_ids must be [BS, k], got {tuple(expert_ids.shape)}")
    if num_experts % world:
        raise DeviceOpError(
            f"num_experts={num_experts} must be divisible by the {world} expert-parallel ranks"
        )
    if global_bs % world or expert_ids.shape[0] > global_bs // world:
        raise DeviceOpError(
            f"global_bs={global_bs} must be a multiple of the {world} ranks and hold this rank's "
            f"{expert_ids.shape[0]} tokens (at most global_bs / ranks per rank)"
        )
    local = num_experts // world
    ids = expert_ids.reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
        raise DeviceOpError(f"expert ids must be within [0, num_experts={num_experts})")
    return local, global_bs // world * min(local, expert_ids.shape[1])


def _active(active_mask: torch.Tensor | None, num_tokens: int, device: torch.device) -> torch.Tensor:
    if active_mask is None:
        return torch.ones(num_tokens, dtype=torch.bool, device=device)
    if active_mask.shape != (num_tokens,):
        raise DeviceOpError(f"active_mask must be [BS] = [{num_tokens}], got {tuple(active_mask.shape)}")
    return active_mask.bool()


def mc2_dispatch(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    group: Any,
    *,
    num_experts: int,
    global_bs: int,
    active_mask: torch.Tensor | None = None,
) -> MoeDispatch:
    if x.dim() != 2 or x.shape[0] != expert_ids.shape[0]:
        raise DeviceOpError(
            f"x must be [BS, H] with BS = expert_ids' {expert_ids.shape[0]}, got {tuple(x.shape)}"
        )
    world = dist.get_world_size(group)
    local, window = _check(expert_ids, world, num_experts, global_bs)
    num_tokens, k = expert_ids.shape
    active = _active(active_mask, num_tokens, x.device)
    ids = expert_ids.long().reshape(-1)
    copy = torch.arange(num_tokens * k, device=x.device)
    sent = active.repeat_interleave(k)
    dest, slot = ids // local, ids % local
    # Within each destination's window: by local expert, then by copy index (t * k + j).
    order = torch.argsort(
        torch.where(sent, dest * (local * num_tokens * k) + slot * num_tokens * k + copy, -1)
    )
    order = order[(~sent).sum() :]
    dest_sorted = dest[order]
    start = torch.searchsorted(dest_sorted, torch.arange(world, device=x.device))
    position = torch.arange(order.numel(), device=x.device) - start[dest_sorted]
    if order.numel() and int(position.max()) >= window:
        raise DeviceOpError(f"a rank was sent more than its window of {window} rows (duplicate expert ids?)")
    send_pos = torch.full((num_tokens * k,), -1, dtype=torch.long, device=x.device)
    send_pos[order] = dest_sorted * window + position
    send = x.new_zeros(world * window, x.shape[1])
    meta = torch.full((world * window,), -1, dtype=torch.long, device=x.device)
    send[send_pos[order]] = x[order // k]
    meta[send_pos[order]] = slot[order]
    recv, recv_meta = torch.empty_like(send), torch.empty_like(meta)
    dist.all_to_all_single(recv, send, group=group)
    dist.all_to_all_single(recv_meta, meta, group=group)
    valid = recv_meta >= 0
    # Received rows by local expert, then source rank, then the sender's order; padding last.
    arrival = torch.argsort(torch.where(valid, recv_meta, local), stable=True)
    counts = torch.bincount(recv_meta[valid], minlength=local)
    return MoeDispatch(recv[arrival], counts.to(torch.int64), (arrival, send_pos))


def mc2_combine(
    expert_output: torch.Tensor,
    dispatch: MoeDispatch,
    expert_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    group: Any,
    *,
    num_experts: int,
    global_bs: int,
    active_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    arrival, send_pos = dispatch.handle
    world = dist.get_world_size(group)
    if expert_output.dim() != 2 or expert_output.shape[0] != arrival.numel():
        raise DeviceOpError(
            f"expert_output must be [A, H] with A = {arrival.numel()} rows (the dispatch's), "
            f"got {tuple(expert_output.shape)}"
        )
    _check(expert_ids, world, num_experts, global_bs)
    if topk_weights.shape != expert_ids.shape:
        raise DeviceOpError(
            f"topk_weights must match expert_ids {tuple(expert_ids.shape)}, got {tuple(topk_weights.shape)}"
        )
    back = torch.empty_like(expert_output)
    back[arrival] = expert_output
    returned = torch.empty_like(back)
    dist.all_to_all_single(returned, back, group=group)
    num_tokens, k = expert_ids.shape
    sent = send_pos >= 0
    rows = returned.new_zeros(num_tokens * k, returned.shape[1], dtype=torch.float32)
    rows[sent] = returned[send_pos[sent]].float()
    weights = topk_weights.float().reshape(-1, 1) * sent.unsqueeze(1)
    out = (rows * weights).view(num_tokens, k, -1).sum(dim=1)
    active = _active(active_mask, num_tokens, out.device)
    return out.masked_fill(~active.unsqueeze(1), 0.0).to(expert_output.dtype)
