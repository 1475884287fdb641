"""MoE communication method per device family and batch, and the MC2 token capacity and mask.

MC2 is the fused dispatch/combine kernel: fastest for decode-sized batches, but its buffers are
sized for a fixed number of tokens per rank (the *capacity*). Larger batches (prefill) use
all-to-all on A3/A5 and all-gather on A2, whose all-to-all is slower than its all-gather; A2's
MC2 only pays off across at least two 8-NPU nodes. 310P has neither MC2 nor all-to-all. Without
expert parallelism, data-parallel ranks exchange tokens by naive multicast.
"""

from __future__ import annotations

import enum

import torch

from vllm_ascend.core import envs
from vllm_ascend.core.device.family import AscendDeviceType

A2_MC2_MIN_EP_SIZE = 16


class MoECommType(enum.StrEnum):
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    MC2 = "mc2"
    NAIVE_MULTICAST = "naive_multicast"


def supported_moe_comm_types(family: AscendDeviceType | None) -> tuple[MoECommType, ...]:
    """Methods a family can run (None: the reference device, which has no MC2 kernel)."""
    if family is AscendDeviceType._310P:
        return (MoECommType.ALLGATHER, MoECommType.NAIVE_MULTICAST)
    if family is None:
        return (MoECommType.ALLGATHER, MoECommType.ALLTOALL, MoECommType.NAIVE_MULTICAST)
    return tuple(MoECommType)


def _select_a2(num_tokens: int, ep_size: int, capacity: int) -> MoECommType:
    if ep_size >= A2_MC2_MIN_EP_SIZE and num_tokens <= capacity:
        return MoECommType.MC2
    return MoECommType.ALLGATHER


def _select_a3_a5(num_tokens: int, capacity: int) -> MoECommType:
    return MoECommType.MC2 if num_tokens <= capacity else MoECommType.ALLTOALL


def select_moe_comm_method(
    num_tokens: int,
    family: AscendDeviceType | str | None,
    ep_size: int,
    dp_size: int = 1,
    mc2_capacity: int = 0,
    forced: str | None = None,
) -> MoECommType:
    """The MoE communication method for a forward of ``num_tokens`` tokens per rank.

    ``forced`` (default: ``VLLM_ASCEND_MOE_COMM_METHOD``; ``"auto"`` means choose) overrides the
    rules but must be runnable on the family and, for MC2, fit the capacity.
    """
    fam = AscendDeviceType.parse(family) if family is not None else None
    if num_tokens < 0 or ep_size < 1 or dp_size < 1 or mc2_capacity < 0:
        raise ValueError(
            f"invalid MoE comm inputs: num_tokens={num_tokens} (>= 0), ep_size={ep_size} (>= 1), "
            f"dp_size={dp_size} (>= 1), mc2_capacity={mc2_capacity} (>= 0)"
        )
    forced = envs.VLLM_ASCEND_MOE_COMM_METHOD if forced is None else forced
    if forced != "auto":
        return _check_forced(forced, fam, num_tokens, ep_size, mc2_capacity)
    if fam is AscendDeviceType._310P:
        return MoECommType.ALLGATHER
    if ep_size == 1:
        return MoECommType.NAIVE_MULTICAST if dp_size > 1 else MoECommType.ALLGATHER
    if fam is None:
        return MoECommType.ALLTOALL
    if fam is AscendDeviceType.A2:
        return _select_a2(num_tokens, ep_size, mc2_capacity)
    return _select_a3_a5(num_tokens, mc2_capacity)


def _check_forced(
    forced: str, fam: AscendDeviceType | None, num_tokens: int, ep_size: int, capacity: int
) -> MoECommType:
    try:
        method = MoECommType(forced)
    except ValueError:
        raise ValueError(
            f"MoE comm method {forced!r} is unknown; allowed: auto, {', '.join(m.value for m in MoECommType)}"
        ) from None
    supported = supported_moe_comm_types(fam)
    where = fam.value if fam is not None else "the reference device"
    if method not in supported:
        raise ValueError(
            f"MoE comm method {method.value!r} is not available on {where}; allowed: "
            f"{', '.join(m.value for m in supported)}"
        )
    if method in (MoECommType.MC2, MoECommType.ALLTOALL) and ep_size == 1:
        raise ValueError(f"MoE comm method {method.value!r} needs expert parallelism (ep_size > 1)")
    if method is MoECommType.MC2 and num_tokens > capacity:
        raise ValueError(
            f"MoE comm method 'mc2' cannot carry {num_tokens} tokens: MC2 capacity is {capacity}"
        )
    return method


def compute_mc2_tokens_capacity(
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    tp_size: int = 1,
    max_num_batched_tokens: int | None = None,
) -> int:
    """Tokens per rank the MC2 buffers hold: one decode step of every sequence (with drafts).

    Rounded up to a multiple of ``tp_size`` (tokens are split evenly across TP ranks) and capped
    by ``max_num_batched_tokens`` (itself rounded up likewise).
    """
    if max_num_seqs < 1 or num_speculative_tokens < 0 or tp_size < 1:
        raise ValueError(
            f"invalid MC2 capacity inputs: max_num_seqs={max_num_seqs} (>= 1), "
            f"num_speculative_tokens={num_speculative_tokens} (>= 0), tp_size={tp_size} (>= 1)"
        )
    tokens = max_num_seqs * (1 + num_speculative_tokens)
    if max_num_batched_tokens is not None:
        tokens = min(tokens, max_num_batched_tokens)
    return -(-tokens // tp_size) * tp_size


class MC2State:
    """Process-wide MC2 capacity and the reusable padding mask (True = real token)."""

    def __init__(self) -> None:
        self.capacity: int | None = None
        self._mask: torch.Tensor | None = None

    def set_capacity(self, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"MC2 tokens capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._mask = torch.zeros(capacity, dtype=torch.bool, device=device)

    def set_mask(
        self, num_actual_tokens: int, num_padded_tokens: int, tp_size: int = 1, tp_rank: int = 0
    ) -> torch.Tensor:
        """Mark the first ``num_actual_tokens`` of ``num_padded_tokens`` real; return this TP rank's slice.

        With sequence parallelism the padded batch is split into ``tp_size`` equal chunks.
        """
        if self.capacity is None or self._mask is None:
            raise RuntimeError("MC2 capacity is not set: call set_mc2_tokens_capacity first")
        if not 0 <= num_actual_tokens <= num_padded_tokens <= self.capacity:
            raise ValueError(
                f"MC2 mask needs 0 <= num_actual_tokens ({num_actual_tokens}) <= num_padded_tokens "
                f"({num_padded_tokens}) <= capacity ({self.capacity})"
            )
        if num_padded_tokens % tp_size or not 0 <= tp_rank < tp_size:
            raise ValueError(
                f"num_padded_tokens={num_padded_tokens} must split evenly over tp_size={tp_size} "
                f"and tp_rank={tp_rank} must be in [0, {tp_size})"
            )
        self._mask[:num_actual_tokens] = True
        self._mask[num_actual_tokens:] = False
        chunk = num_padded_tokens // tp_size
        return self._mask[tp_rank * chunk : (tp_rank + 1) * chunk]


_MC2 = MC2State()


def set_mc2_tokens_capacity(capacity: int, device: torch.device | str = "cpu") -> None:
    _MC2.set_capacity(capacity, device)


def get_mc2_tokens_capacity() -> int | None:
    return _MC2.capacity


def set_mc2_mask(
    num_actual_tokens: int, num_padded_tokens: int, tp_size: int = 1, tp_rank: int = 0
) -> torch.Tensor:
    return _MC2.set_mask(num_actual_tokens, num_padded_tokens, tp_size, tp_rank)


def reset_mc2_state() -> None:
    """Forget capacity and mask (tests; re-initialisation)."""
    _MC2.capacity = None
    _MC2._mask = None
