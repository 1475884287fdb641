"""Stand-ins for the CUDA-only Triton kernels of vLLM's draft-model speculative decoding.

``vllm.v1.spec_decode.utils`` launches four Triton kernels to build the drafter's inputs (EAGLE,
draft models). vLLM's kernel dispatcher forwards each launch's arguments, by the kernel's own
parameter names, to the functions here, which compute the same values with the plain-torch
functions of ``vllm_ascend.kernels`` on whatever device the tensors live on. Triton tile sizes
(``BLOCK_SIZE_*``) and the launch grid carry no meaning here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import vllm_ascend.kernels as kernels


def eagle_step_slot_mapping_metadata_kernel(
    positions_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    seq_lens_ptr: torch.Tensor,
    out_clamped_positions_ptr: torch.Tensor,
    out_slot_mapping_ptr: torch.Tensor,
    block_size: int,
    max_model_len: int,
    n_blocks_per_req: int,
    PAD_ID: int,
    batch_size: int,
) -> None:
    """One draft step's positions, slots and sequence lengths; ``out_slot_mapping_ptr`` past
    ``batch_size`` is graph padding and gets ``PAD_ID``."""
    table = block_table_ptr.as_strided((batch_size, n_blocks_per_req), (block_table_stride, 1))
    kernels.eagle_step_slot_mapping(
        positions_ptr[:batch_size],
        table,
        seq_lens_ptr,
        out_clamped_positions_ptr,
        out_slot_mapping_ptr,
        block_size,
        max_model_len,
        PAD_ID,
    )


def eagle_prepare_inputs_padded_kernel(
    cu_num_draft_tokens_ptr: torch.Tensor,
    valid_sampled_tokens_count_ptr: torch.Tensor,
    query_start_loc_gpu_ptr: torch.Tensor,
    token_indices_to_sample_ptr: torch.Tensor,
    num_rejected_tokens_gpu_ptr: torch.Tensor,
    num_reqs: int,
) -> None:
    """Rejected draft count and sampling index of the first ``num_reqs`` requests."""
    kernels.eagle_prepare_inputs_padded(
        cu_num_draft_tokens_ptr[:num_reqs],
        valid_sampled_tokens_count_ptr[:num_reqs],
        query_start_loc_gpu_ptr,
        token_indices_to_sample_ptr,
        num_rejected_tokens_gpu_ptr,
    )


def eagle_prepare_next_token_padded_kernel(
    sampled_token_ids_ptr: torch.Tensor,
    discard_request_mask_ptr: torch.Tensor,
    backup_next_token_ids_ptr: torch.Tensor,
    next_token_ids_ptr: torch.Tensor,
    valid_sampled_tokens_count_ptr: torch.Tensor,
    vocab_size: int,
    num_sampled_tokens_per_req: int,
    num_reqs: int,
    stride_sampled_token_ids: int,
    BLOCK_SIZE_TOKENS: int,
) -> None:
    """Valid sampled-token count and next token of the first ``num_reqs`` requests, reading
    ``num_sampled_tokens_per_req`` tokens per row ``stride_sampled_token_ids`` elements apart."""
    sampled = sampled_token_ids_ptr.as_strided(
        (num_reqs, num_sampled_tokens_per_req), (stride_sampled_token_ids, 1)
    )
    kernels.eagle_prepare_next_token_padded(
        sampled,
        discard_request_mask_ptr,
        backup_next_token_ids_ptr,
        vocab_size,
        next_token_ids_ptr,
        valid_sampled_tokens_count_ptr,
    )


def copy_and_expand_eagle_inputs_kernel(
    target_token_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    next_token_ids_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_positions_ptr: torch.Tensor,
    out_is_rejected_token_mask_ptr: torch.Tensor,
    out_is_masked_token_mask_ptr: torch.Tensor,
    out_new_token_indices_ptr: torch.Tensor,
    out_hidden_state_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    query_end_loc_ptr: torch.Tensor,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    total_input_tokens: int,
    num_padding_slots_per_request: int,
    shift_input_ids: bool,
    BLOCK_SIZE_TOKENS: int,
) -> None:
    """Drafter input layout of every request; the batch (the kernel's grid rows) is the length of
    ``query_end_loc_ptr``."""
    batch = query_end_loc_ptr.shape[0]
    kernels.copy_and_expand_eagle_inputs(
        target_token_ids_ptr[:total_input_tokens],
        target_positions_ptr[:total_input_tokens],
        next_token_ids_ptr,
        query_start_loc_ptr[: batch + 1],
        query_end_loc_ptr,
        out_input_ids_ptr,
        out_positions_ptr,
        out_is_rejected_token_mask_ptr,
        out_is_masked_token_mask_ptr,
        out_new_token_indices_ptr,
        out_hidden_state_mapping_ptr,
        padding_token_id,
        parallel_drafting_token_id,
        num_padding_slots_per_request,
        shift_input_ids,
    )


_KERNELS = "vllm.v1.spec_decode.utils"

#: Draft-input kernels of ``vllm.v1.spec_decode.utils`` replaced on the Ascend platform.
SPEC_DECODE_KERNEL_OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_KERNELS}.{impl.__name__}": impl
    for impl in (
        eagle_step_slot_mapping_metadata_kernel,
        eagle_prepare_inputs_padded_kernel,
        eagle_prepare_next_token_padded_kernel,
        copy_and_expand_eagle_inputs_kernel,
    )
}
