"""vLLM's punica wrapper (multi-LoRA) on the kernels' LoRA shrink / expand.

vLLM keeps the token->adapter mapping (``PunicaWrapperBase.update_metadata``); this class applies it. Where the
Triton kernels serve, every step runs per token on the step's tokens ordered by adapter (built once per step); on
the reference device a mapping vLLM marks prefill (vLLM 0.32's V1 and V2 runners mark every step so) runs per run
of tokens sharing an adapter (``prefill_metadata``), any other per token; the logits per sampled row. The kernels run their Triton kernels
on NPUs and their torch references on the reference device.

A merged layer's slices (QKV, gate-up) run in one shrink and one expand launch over all slices, on the
``[S, T, rank]`` buffer vLLM's LoRA layers pass.

Graphs: what ``torch.compile`` traces or a device graph captures runs per token, through the custom ops
``torch.ops.vllm.ascend_lora_shrink`` / ``ascend_lora_expand`` and their ``_slices`` forms (opaque to Dynamo) on the persistent
``max_num_batched_tokens`` mapping buffer, sliced to the batch's (padded) rows inside the op: the segmented
path reads the step's runs as host integers, which a traced or captured region would bake in. Rows past the
step's tokens (graph padding) map to no adapter.

Tensor parallelism needs nothing more: vLLM's LoRA layers slice A and B per rank and call ``add_shrink`` /
``add_expand`` (with ``offset_start``) around their own all-gather / all-reduce (``fully_sharded_loras``).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
from vllm.utils.torch_utils import direct_register_custom_op

from vllm_ascend.kernels import use_triton
from vllm_ascend.kernels.lora import (
    lora_expand,
    lora_expand_segmented,
    lora_expand_segmented_slices,
    lora_expand_slices,
    lora_reserve,
    lora_shrink,
    lora_shrink_segmented,
    lora_shrink_segmented_slices,
    lora_shrink_slices,
    lora_token_order,
)


def _writes_out_only(*args: Any, **kwargs: Any) -> None:
    """Fake (meta) implementation of the ops: they only write their ``out`` argument in place."""
    return None


direct_register_custom_op(
    op_name="ascend_lora_shrink", op_func=lora_shrink, mutates_args=["out"], fake_impl=_writes_out_only
)
direct_register_custom_op(
    op_name="ascend_lora_expand", op_func=lora_expand, mutates_args=["out"], fake_impl=_writes_out_only
)
direct_register_custom_op(
    op_name="ascend_lora_shrink_slices",
    op_func=lora_shrink_slices,
    mutates_args=["out"],
    fake_impl=_writes_out_only,
)
direct_register_custom_op(
    op_name="ascend_lora_expand_slices",
    op_func=lora_expand_slices,
    mutates_args=["out"],
    fake_impl=_writes_out_only,
)


def _stacked_slices(weights: tuple[torch.Tensor, ...], io: Any) -> bool:
    """A merged layer's slices (QKV, gate-up) whose buffer is one ``[S, T, rank]`` tensor, as vLLM's LoRA layers
    allocate it: served by one launch for all slices."""
    return len(weights) > 1 and isinstance(io, torch.Tensor) and io.ndim == 3


class AscendPunicaWrapper(PunicaWrapperBase):
    """Multi-LoRA for the dense layers, the embedding, the logits and full-linear classifier heads
    (fused-MoE LoRA: ``ops/moe_lora.py``, on the MoE runner's expert rows with this wrapper's token mapping)."""

    def __init__(
        self, max_num_batched_tokens: int, max_batches: int, device: torch.device | str, **kwargs: Any
    ) -> None:
        super().__init__(max_num_batched_tokens, max_batches, device)
        lora_config = kwargs.get("lora_config")
        if lora_config is not None:
            lora_reserve(torch.device(device), lora_config.max_loras)
        #: The step's tokens ordered by adapter (``lora_token_order``), persistent for graphs; built where the
        #: Triton kernels serve (they then visit only each adapter's own tokens), None elsewhere.
        self._token_order: torch.Tensor | None = None
        self._lora_starts: torch.Tensor | None = None

    def update_metadata(
        self, mapping: Any, lora_index_to_id: list[int | None], *args: Any, **kwargs: Any
    ) -> None:
        """vLLM's update, then the rows past the step's tokens (a graph's padding) mapped to no adapter, and the
        tokens ordered by adapter for the per-token kernels."""
        super().update_metadata(mapping, lora_index_to_id, *args, **kwargs)
        self._token_lora_indices[self.indices_len[0] :].fill_(-1)
        if not use_triton(torch.device(self.device)):
            return
        # adapter slots: the stacked weights' first axis (vLLM passes its slot count + 1 as max_loras)
        slots = max(len(lora_index_to_id), int(kwargs.get("max_loras", args[0] if args else 0)))
        if self._lora_starts is None or self._lora_starts.numel() != slots + 2:
            self._token_order = torch.empty_like(self._token_lora_indices, dtype=torch.int64)
            self._lora_starts = torch.empty(
                slots + 2, dtype=torch.int64, device=self._token_lora_indices.device
            )
        assert self._token_order is not None
        lora_token_order(self._token_lora_indices, slots, self._token_order, self._lora_starts)

    def _per_token(self) -> bool:
        """Per token for a decode mapping, wherever the call is traced (``torch.compile``) or captured (a step
        with a graph runtime mode), and wherever the Triton kernels serve (the step's tokens ordered by adapter
        make the per-token kernels visit only each adapter's own tokens, as segments would, and split the
        reduction of small batches); segmented otherwise (the reference device: one matrix product per run)."""
        if torch.compiler.is_compiling() or not self.is_prefill or self._lora_starts is not None:
            return True
        return (
            is_forward_context_available()
            and get_forward_context().cudagraph_runtime_mode != CUDAGraphMode.NONE
        )

    def _shrink(self, out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, scale: float) -> None:
        if self._per_token():
            torch.ops.vllm.ascend_lora_shrink(
                x, lora_a, out, self._token_lora_indices, scale, self._token_order, self._lora_starts
            )
        elif not self.no_lora:
            starts, lens, loras, _, max_len, _ = self.prefill_metadata
            lora_shrink_segmented(x, lora_a, out, starts, lens, loras, max_len, scale)

    def _expand(
        self, out: torch.Tensor, z: torch.Tensor, lora_b: torch.Tensor, offset: int, add_inputs: bool
    ) -> None:
        if self._per_token():
            torch.ops.vllm.ascend_lora_expand(
                z,
                lora_b,
                out,
                self._token_lora_indices,
                offset,
                add_inputs,
                self._token_order,
                self._lora_starts,
            )
        elif not self.no_lora:
            starts, lens, loras, _, max_len, _ = self.prefill_metadata
            lora_expand_segmented(z, lora_b, out, starts, lens, loras, max_len, offset, add_inputs)

    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        """``y[i] = scale * x @ A_i^T`` per slice, each token with its adapter's ``A_i`` (all slices in one
        launch where ``y`` is one ``[S, T, rank]`` tensor)."""
        x = x.view(-1, x.shape[-1])
        if not _stacked_slices(lora_a_stacked, y):
            for i, lora_a in enumerate(lora_a_stacked):
                self._shrink(y[i], x, lora_a, scale)
        elif self._per_token():
            torch.ops.vllm.ascend_lora_shrink_slices(
                x,
                list(lora_a_stacked),
                y,
                self._token_lora_indices,
                scale,
                self._token_order,
                self._lora_starts,
            )
        elif not self.no_lora:
            starts, lens, loras, _, max_len, _ = self.prefill_metadata
            lora_shrink_segmented_slices(x, lora_a_stacked, y, starts, lens, loras, max_len, scale)

    def add_expand(
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """``y[:, off_i:off_i+n_i] (+)= x[i] @ B_i^T``, the slices laid side by side from ``offset_start`` (all
        slices in one launch where ``x`` is one ``[S, T, rank]`` tensor)."""
        out = y.view(-1, y.shape[-1])
        offsets = [offset_start]
        for width in output_slices[:-1]:
            offsets.append(offsets[-1] + width)
        if not _stacked_slices(lora_b_stacked, x):
            for i, (lora_b, offset) in enumerate(zip(lora_b_stacked, offsets, strict=True)):
                self._expand(out, x[i], lora_b, offset, add_inputs)
        elif self._per_token():
            torch.ops.vllm.ascend_lora_expand_slices(
                x,
                list(lora_b_stacked),
                out,
                self._token_lora_indices,
                offsets,
                add_inputs,
                self._token_order,
                self._lora_starts,
            )
        elif not self.no_lora:
            starts, lens, loras, _, max_len, _ = self.prefill_metadata
            lora_expand_segmented_slices(
                x, lora_b_stacked, out, starts, lens, loras, max_len, offsets, add_inputs
            )

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """``y += x @ B^T``: ``x`` is each token's row of its adapter's embedding A (looked up by vLLM)."""
        self._expand(y.view(-1, y.shape[-1]), x, lora_b_stacked, 0, add_inputs)

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        """``y[:, slice_i] += scale * x @ A_i^T @ B_i^T`` through an fp32 ``[S, T, rank]`` buffer."""
        if buffer is None:
            rank = lora_b_stacked[0].size(-1)
            buffer = torch.zeros(len(output_slices), x.size(0), rank, dtype=torch.float32, device=x.device)
        self.add_shrink(buffer, x, lora_a_stacked, scale)
        self.add_expand(y, buffer, lora_b_stacked, output_slices, add_inputs=True)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        """``y += scale * x @ A^T @ B^T`` per sampled row (``sampler_indices``); B's padded vocabulary rows past
        ``y``'s width are dropped."""
        out = y.view(-1, y.shape[-1])
        x = x.view(-1, x.shape[-1])
        if buffer is None:
            buffer = torch.zeros(x.size(0), lora_b_stacked.size(-1), dtype=torch.float32, device=x.device)
        lora_shrink(x, lora_a_stacked, buffer, self.sampler_indices, scale)
        lora_expand(buffer, lora_b_stacked[..., : out.shape[1], :], out, self.sampler_indices, 0, True)

    def apply_lora_full_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        weight_stacked: torch.Tensor,
        bias_stacked: torch.Tensor,
        module_enabled: torch.Tensor,
    ) -> None:
        """Rows of requests whose adapter replaces the module: ``x @ W^T + b`` instead of ``y``."""
        adapter_y = torch.zeros(x.size(0), weight_stacked.size(-2), dtype=torch.float32, device=x.device)
        lora_shrink(x, weight_stacked, adapter_y, self.sampler_indices, 1.0)
        y.copy_(self._select_full_linear_output(y, adapter_y, bias_stacked, module_enabled))
