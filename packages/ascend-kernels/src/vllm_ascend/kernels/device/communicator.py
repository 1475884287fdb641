"""The platform's device communicator: ``torch.distributed`` collectives over the profile's backend
(hccl on NPUs, gloo on the reference device) and, for expert parallel across data-parallel ranks, the
all-gather dispatch / reduce-scatter combine of tokens that vLLM's MoE runner calls.

vLLM's ``DeviceCommunicatorBase`` creates no all2all manager, and the model runner asks the expert-parallel
group for one whenever a MoE model runs with ``data_parallel_size > 1``; this class provides vLLM's own
all-gather/reduce-scatter manager (``AgRsAll2AllManager``) over the group's CPU process group, the only
all2all backend served (others are refused by name).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

from vllm_ascend.core.sdk import ConfigError

SERVED_ALL2ALL_BACKENDS = ("allgather_reducescatter", "naive")


class AscendDeviceCommunicator(DeviceCommunicatorBase):
    """``DeviceCommunicatorBase`` plus the expert-parallel token dispatch/combine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.use_all2all:
            if self.all2all_backend not in SERVED_ALL2ALL_BACKENDS:
                raise ConfigError(
                    f"parallel_config.all2all_backend = {self.all2all_backend!r} is not supported by vllm-ascend; "
                    f"supported: {', '.join(SERVED_ALL2ALL_BACKENDS)}"
                )
            from vllm.distributed.device_communicators.all2all import AgRsAll2AllManager

            self.all2all_manager = AgRsAll2AllManager(self.cpu_group)

    def all_gatherv(
        self,
        input_: torch.Tensor | list[torch.Tensor],
        dim: int = 0,
        sizes: list[int] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Concatenate every rank's tensor(s) along ``dim``; rank ``r`` holds ``sizes[r]`` rows there (equal
        sizes when ``None``). Unequal tensors are padded to the largest for the collective, then trimmed."""
        if isinstance(input_, list):
            return [self._gatherv(t, dim, sizes) for t in input_]
        return self._gatherv(input_, dim, sizes)

    def _gatherv(self, tensor: torch.Tensor, dim: int, sizes: list[int] | None) -> torch.Tensor:
        dim = dim % tensor.dim()
        if sizes is None:
            sizes = [tensor.shape[dim]] * self.world_size
        if len(sizes) != self.world_size or sizes[self.rank_in_group] != tensor.shape[dim]:
            raise ValueError(
                f"all_gatherv: sizes {sizes} must give this rank's {tensor.shape[dim]} rows for each of "
                f"{self.world_size} ranks"
            )
        longest = max(sizes)
        padded = tensor.movedim(dim, 0)
        if padded.shape[0] < longest:
            pad = padded.new_zeros((longest - padded.shape[0], *padded.shape[1:]))
            padded = torch.cat([padded, pad])
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, padded.contiguous(), group=self.device_group)
        gathered = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])
        return gathered.movedim(0, dim)

    def reduce_scatterv(
        self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None
    ) -> torch.Tensor:
        """Sum ``input_`` over the ranks and keep this rank's ``sizes[rank]`` rows of ``dim`` (equal shares
        when ``None``)."""
        dim = dim % input_.dim()
        total = input_.shape[dim]
        if sizes is None:
            if total % self.world_size:
                raise ValueError(f"reduce_scatterv: {total} rows do not split over {self.world_size} ranks")
            sizes = [total // self.world_size] * self.world_size
        if len(sizes) != self.world_size or sum(sizes) != total:
            raise ValueError(f"reduce_scatterv: sizes {sizes} must add up to the {total} rows of dim {dim}")
        summed = input_.clone()
        torch.distributed.all_reduce(summed, group=self.device_group)
        start = sum(sizes[: self.rank_in_group])
        return summed.narrow(dim, start, sizes[self.rank_in_group]).contiguous()

    def dispatch_router_logits(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        is_sequence_parallel: bool = False,
        extra_tensors: list[torch.Tensor] | None = None,
    ) -> Any:
        if self.all2all_manager is None:
            return super().dispatch_router_logits(
                hidden_states, router_logits, is_sequence_parallel, extra_tensors
            )
        return self.all2all_manager.dispatch_router_logits(
            hidden_states, router_logits, is_sequence_parallel, extra_tensors
        )

    def dispatch(
        self,
        hidden_states: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        is_sequence_parallel: bool = False,
        extra_tensors: list[torch.Tensor] | None = None,
    ) -> Any:
        if self.all2all_manager is None:
            return super().dispatch(
                hidden_states, topk_weights, topk_ids, is_sequence_parallel, extra_tensors
            )
        return self.all2all_manager.dispatch(
            hidden_states, topk_weights, topk_ids, is_sequence_parallel, extra_tensors=extra_tensors
        )

    def combine(self, hidden_states: torch.Tensor, is_sequence_parallel: bool = False) -> torch.Tensor:
        if self.all2all_manager is None:
            return super().combine(hidden_states, is_sequence_parallel)
        return self.all2all_manager.combine(hidden_states, is_sequence_parallel)
