"""MoE communication methods of the Ascend MoE runner, and their per-step selection.

With expert parallel, each rank holds ``L`` experts (physical expert ``p`` lives on rank ``p // L``).
Three ways move tokens to their experts and back:

- ``allgather``: every rank sees every token (vLLM gathers data-parallel ranks' tokens), computes the
  copies routed to its own experts, and the partial outputs are summed (vLLM's reduce-scatter/all-reduce).
- ``alltoall``: each rank routes only its own tokens (tensor-parallel ranks, which share tokens, take
  equal slices); the copies go to their experts' ranks in one ``all_to_all_single`` with exact split
  sizes and come back in a second one; tensor-parallel ranks then all-gather their slices.
- ``mc2``: the same exchange through the device's fused dispatch/combine (``npu_moe_distribute_dispatch``
  / ``combine``): every rank's tokens are padded to a fixed capacity (an active mask marks the real
  ones) and each peer owns a capacity-sized window, so the bytes moved do not depend on the routing.

Selection follows the device profile's MoE data (``moe_comm_methods``, ``moe_comm_fallback``,
``mc2_min_ep_ranks``), each forward (``select_moe_comm_method``); a method can be forced with
``VLLM_ASCEND_MOE_COMM_METHOD``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vllm_ascend.core.sdk import get_device_adaptor

#: Expert rows of one rank: ``(rows grouped by local expert [M, H], rows per local expert [L]) -> [M, H]``.
ExpertsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Upper bound of MC2's per-step token capacity (before the tensor-parallel split), as upstream sizes it.
MC2_MAX_CAPACITY = 512


class MoECommType(enum.StrEnum):
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    MC2 = "mc2"


class MoECommError(ValueError):
    """A MoE communication method asked for where it cannot run."""


@dataclass(frozen=True)
class MoECommConfig:
    """What the per-step choice reads; fixed for a model.

    ``device``: the profile's name (for messages). ``methods``: the methods the device runs (MC2 only where
    it has MC2 dispatch/combine); ``fallback``: the one a step takes when MC2 does not; ``mc2_min_ranks``:
    expert-parallel ranks from which MC2 is taken. ``capacity``: tokens per step (the largest data-parallel
    rank's, before the tensor-parallel split) MC2's buffers hold. ``even``: the experts divide evenly over
    the expert-parallel ranks (all-to-all and MC2 need it).
    """

    device: str
    ep_size: int
    tp_size: int
    capacity: int
    even: bool
    methods: tuple[MoECommType, ...] = tuple(MoECommType)
    fallback: MoECommType = MoECommType.ALLTOALL
    mc2_min_ranks: int = 1
    forced: MoECommType | None = None

    @classmethod
    def for_profile(cls, profile: Any, **fields: Any) -> MoECommConfig:
        """The config of a device whose profile is ``profile`` (its MoE fields)."""
        return cls(
            device=profile.name,
            methods=tuple(MoECommType(m) for m in profile.moe_comm_methods_available),
            fallback=MoECommType(profile.moe_comm_fallback),
            mc2_min_ranks=profile.mc2_min_ep_ranks,
            **fields,
        )

    def __post_init__(self) -> None:
        if self.fallback not in self.methods or self.fallback is MoECommType.MC2:
            raise MoECommError(f"fallback {self.fallback.value} is not among the methods of {self.device}")
        if self.forced is not None and self.forced not in self.methods:
            raise MoECommError(
                f"VLLM_ASCEND_MOE_COMM_METHOD={self.forced.value} is not available on {self.device}; allowed: "
                f"{', '.join(m.value for m in self.methods)}"
            )
        if self.forced is None or self.ep_size == 1 or self.forced is MoECommType.ALLGATHER:
            return
        if not self.even:
            raise MoECommError(
                f"VLLM_ASCEND_MOE_COMM_METHOD={self.forced.value} needs the experts to divide evenly over the "
                f"{self.ep_size} expert-parallel ranks; use allgather"
            )

    @property
    def rank_capacity(self) -> int:
        """MC2 tokens per rank (after the tensor-parallel split)."""
        return math.ceil(self.capacity / self.tp_size)


def mc2_capacity(max_num_seqs: int, decode_query_len: int, max_num_batched_tokens: int, forced: bool) -> int:
    """MC2's tokens per step: a decode step's (``max_num_seqs`` × tokens per request, at most
    :data:`MC2_MAX_CAPACITY`); every step's when MC2 is forced."""
    if forced:
        return max_num_batched_tokens
    return min(max_num_seqs * decode_query_len, MC2_MAX_CAPACITY)


def select_moe_comm_method(config: MoECommConfig, num_tokens: int, captured: bool = False) -> MoECommType:
    """The method of a step whose largest data-parallel rank runs ``num_tokens`` tokens. A ``captured`` step (run
    as a graph) never takes the all-to-all, forced or not: its split sizes are the step's own (read on the host),
    which a graph cannot take from its capture; all-gather has fixed shapes."""
    method = _select(config, num_tokens)
    return MoECommType.ALLGATHER if captured and method is MoECommType.ALLTOALL else method


def _select(config: MoECommConfig, num_tokens: int) -> MoECommType:
    if config.ep_size == 1:
        return MoECommType.ALLGATHER  # experts are tensor-parallel slices: nothing to route between ranks
    if config.forced is not None:
        return config.forced
    if not config.even:
        return MoECommType.ALLGATHER
    if (
        MoECommType.MC2 in config.methods
        and num_tokens <= config.capacity
        and config.ep_size >= config.mc2_min_ranks
    ):
        return MoECommType.MC2
    return config.fallback


# -- token slices of tensor-parallel ranks ------------------------------------------------------------
def split_tokens(x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s equal slice of ``x``'s rows, padded with zero rows to a multiple of ``size``."""
    if size == 1:
        return x
    per_rank = math.ceil(x.shape[0] / size)
    padded = x.new_zeros(per_rank * size, *x.shape[1:])
    padded[: x.shape[0]] = x
    return padded[rank * per_rank : (rank + 1) * per_rank]


def gather_tokens(part: torch.Tensor, num_tokens: int, group: Any, size: int) -> torch.Tensor:
    """Inverse of :func:`split_tokens` over the tensor-parallel ``group``: every rank's slice, ``[:num_tokens]``."""
    if size == 1:
        return part
    full = part.new_empty(part.shape[0] * size, *part.shape[1:])
    dist.all_gather_single(full, part.contiguous(), group=group)
    return full[:num_tokens]


# -- the three methods ----------------------------------------------------------------------------------
def allgather_experts(
    x: torch.Tensor, local_ids: torch.Tensor, weights: torch.Tensor, num_local: int, experts: ExpertsFn
) -> torch.Tensor:
    """This rank's share of every token's output: ``local_ids`` are local experts, -1 where another rank
    holds the expert (those copies are grouped last and skipped)."""
    ad = get_device_adaptor()
    ids = torch.where(local_ids < 0, num_local, local_ids)
    sorted_x, row_idx, counts = ad.moe_init_routing(x, ids, num_local + 1)
    rows = experts(sorted_x, counts[:num_local])
    return ad.moe_finalize_routing(rows, row_idx, weights.masked_fill(local_ids < 0, 0.0))


def alltoall_experts(
    x: torch.Tensor,
    physical_ids: torch.Tensor,
    weights: torch.Tensor,
    num_local: int,
    experts: ExpertsFn,
    group: Any,
) -> torch.Tensor:
    """Every token's full output, its copies computed on their experts' ranks (two variable all-to-alls)."""
    ad = get_device_adaptor()
    world = dist.get_world_size(group)
    sorted_x, row_idx, counts = ad.moe_init_routing(x, physical_ids, world * num_local)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [source rank, local expert]
    send_splits = counts.view(world, num_local).sum(1).tolist()
    recv_splits = recv_counts.view(world, num_local).sum(1).tolist()
    received = sorted_x.new_empty(sum(recv_splits), x.shape[1])
    dist.all_to_all_single(received, sorted_x, recv_splits, send_splits, group=group)
    # Arrived by source rank then local expert: regroup by local expert for the grouped matmuls.
    expert_of_row = torch.arange(num_local, device=x.device).repeat(world).repeat_interleave(recv_counts)
    order = torch.argsort(expert_of_row, stable=True)
    rows = experts(received[order], recv_counts.view(world, num_local).sum(0))
    back = torch.empty_like(rows)
    back[order] = rows
    returned = back.new_empty(sorted_x.shape[0], back.shape[1])
    dist.all_to_all_single(returned, back, send_splits, recv_splits, group=group)
    return ad.moe_finalize_routing(returned, row_idx, weights)


def mc2_experts(
    x: torch.Tensor,
    physical_ids: torch.Tensor,
    weights: torch.Tensor,
    num_local: int,
    experts: ExpertsFn,
    group: Any,
    rank_capacity: int,
) -> torch.Tensor:
    """Every token's full output through the device's MC2 dispatch/combine, ``x`` padded to the capacity."""
    num_tokens = x.shape[0]
    if num_tokens > rank_capacity:
        raise MoECommError(f"MC2 got {num_tokens} tokens on one rank; its capacity is {rank_capacity}")
    ad = get_device_adaptor()
    world = dist.get_world_size(group)
    active = torch.arange(rank_capacity, device=x.device) < num_tokens
    padded_x = x.new_zeros(rank_capacity, x.shape[1])
    padded_x[:num_tokens] = x
    ids = physical_ids.new_zeros(rank_capacity, physical_ids.shape[1])
    ids[:num_tokens] = physical_ids
    # Padding tokens are masked out; distinct ids keep them within the per-peer window rules.
    ids[num_tokens:] = torch.arange(physical_ids.shape[1], device=x.device, dtype=ids.dtype)
    w = weights.new_zeros(rank_capacity, weights.shape[1])
    w[:num_tokens] = weights
    shape = {"num_experts": world * num_local, "global_bs": rank_capacity * world, "active_mask": active}
    dispatched = ad.moe_distribute_dispatch(padded_x, ids, group, **shape)
    rows = experts(dispatched.expand_x, dispatched.expert_token_nums)
    return ad.moe_distribute_combine(rows, dispatched, ids, w, group, **shape)[:num_tokens]
