"""V2 input-batch overrides against vLLM's own kernels (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import input_batch as v2

from .vllm_oracle import clone_args, vllm_kernel

pytestmark = pytest.mark.usefixtures("reference_form")


@pytest.mark.parametrize("num_reqs", [0, 1, 6])
def test_prepare_pos_seq_lens_matches_vllm(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs = 8
    query_lens = torch.randint(1, 9, (num_reqs,), generator=g)
    qsl = torch.zeros(max_reqs + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = torch.cumsum(query_lens, 0)
    args = {
        "pos_ptr": torch.full((64,), -7, dtype=torch.int64),
        "seq_lens_ptr": torch.full((max_reqs,), -3, dtype=torch.int32),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "num_computed_tokens_ptr": torch.randint(0, 50, (max_reqs,), generator=g, dtype=torch.int32),
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 4,
    }
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.input_batch._prepare_pos_seq_lens_kernel")((num_reqs + 1,), **expected)
    v2.prepare_pos_seq_lens_torch((num_reqs + 1,), **args)
    assert torch.equal(args["pos_ptr"], expected["pos_ptr"])
    assert torch.equal(args["seq_lens_ptr"], expected["seq_lens_ptr"])


def _qsl(query_lens: torch.Tensor) -> torch.Tensor:
    qsl = torch.zeros(query_lens.numel() + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    return qsl


def _mismatches(kernel: str, grid: tuple[int, ...], args: dict, reference) -> list[str]:
    """vLLM's kernel and ``reference`` on equal copies of ``args``: the tensor arguments they leave different."""
    expected = clone_args(args)
    vllm_kernel(f"vllm.v1.worker.gpu.input_batch.{kernel}")(grid, **expected)
    reference(grid, **args)
    return [
        name
        for name, value in args.items()
        if isinstance(value, torch.Tensor) and not torch.equal(value, expected[name])
    ]


@pytest.mark.parametrize(("seed", "num_reqs"), [(0, 4), (1, 4), (2, 6), (3, 1), (4, 0)])
def test_prepare_prefill_inputs_matches_vllm(seed: int, num_reqs: int) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs, max_len, lookahead = 6, 40, 3
    prefill = torch.randint(5, 30, (max_reqs,), generator=g, dtype=torch.int32)
    computed = torch.minimum(torch.randint(0, 30, (max_reqs,), generator=g, dtype=torch.int32), prefill + 2)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    query_lens = torch.clamp(prefill[idx.long()] - computed[idx.long()], min=1, max=6)
    args = {
        "input_ids_ptr": torch.full((64,), -1, dtype=torch.int32),
        "next_prefill_tokens_ptr": torch.full((lookahead, max_reqs), -5, dtype=torch.int32),
        "next_prefill_tokens_stride": max_reqs,
        "num_lookahead": lookahead,
        "idx_mapping_ptr": idx,
        "query_start_loc_ptr": _qsl(query_lens),
        "all_token_ids_ptr": torch.randint(0, 500, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "prefill_lens_ptr": prefill,
        "num_computed_tokens_ptr": computed,
        "BLOCK_SIZE": 8,
        "LOOKAHEAD_BLOCK": 4,
    }
    assert not _mismatches(
        "_prepare_prefill_inputs_kernel", (num_reqs,), args, v2.prepare_prefill_inputs_torch
    )


@pytest.mark.parametrize(("seed", "new_sampled"), [(0, 1), (1, 1), (2, 0)])
def test_combine_sampled_and_draft_tokens_matches_vllm(seed: int, new_sampled: int) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs, num_reqs, steps = 6, 5, 3
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    num_logits = torch.randint(max(new_sampled, 1), steps + new_sampled + 1, (num_reqs,), generator=g)
    query_lens = num_logits + torch.randint(0, 4, (num_reqs,), generator=g)
    qsl = _qsl(query_lens)
    cu = _qsl(num_logits)
    prefill = torch.randint(3, 20, (max_reqs,), generator=g, dtype=torch.int32)
    seq_lens = prefill[idx.long()] + torch.randint(-3, 8, (num_reqs,), generator=g, dtype=torch.int32)
    args = {
        "input_ids_ptr": torch.randint(0, 100, (int(qsl[-1]) + 2,), generator=g, dtype=torch.int32),
        "idx_mapping_ptr": idx,
        "last_sampled_tokens_ptr": torch.randint(500, 600, (max_reqs, 1), generator=g, dtype=torch.int64),
        "query_start_loc_ptr": qsl,
        "seq_lens_ptr": seq_lens,
        "prefill_len_ptr": prefill,
        "draft_tokens_ptr": torch.randint(700, 800, (max_reqs, steps), generator=g, dtype=torch.int32),
        "draft_tokens_stride": steps,
        "cu_num_logits_ptr": cu,
        "logits_indices_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int64),
        "BLOCK_SIZE": 4,
        "NUM_NEW_SAMPLED_TOKENS": new_sampled,
    }
    assert not _mismatches(
        "_combine_sampled_and_draft_tokens_kernel",
        (num_reqs,),
        args,
        v2.combine_sampled_and_draft_tokens_torch,
    )


@pytest.mark.parametrize("num_reqs", [1, 6])
def test_get_num_sampled_and_rejected_matches_vllm(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(3 + num_reqs)
    max_reqs = 8
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    num_logits = torch.randint(1, 5, (num_reqs,), generator=g)
    args = {
        "num_sampled_ptr": torch.minimum(torch.randint(1, 5, (num_reqs,), generator=g), num_logits).to(
            torch.int32
        ),
        "num_rejected_ptr": torch.full((num_reqs,), -1, dtype=torch.int32),
        "seq_lens_ptr": torch.randint(5, 30, (num_reqs,), generator=g, dtype=torch.int32),
        "cu_num_logits_ptr": _qsl(num_logits),
        "idx_mapping_ptr": idx,
        "prefill_len_ptr": torch.randint(5, 30, (max_reqs,), generator=g, dtype=torch.int32),
    }
    assert not _mismatches(
        "_get_num_sampled_and_rejected_kernel", (num_reqs,), args, v2.get_num_sampled_and_rejected_torch
    )


@pytest.mark.parametrize(("with_counts", "with_qsl"), [(True, True), (False, True), (True, False)])
def test_post_update_matches_vllm(with_counts: bool, with_qsl: bool) -> None:
    g = torch.Generator().manual_seed(4)
    max_reqs, num_reqs, width, vocab, max_len = 6, 5, 3, 32, 40
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[2] = -1  # a skipped row
    args = {
        "idx_mapping_ptr": idx,
        "num_computed_tokens_ptr": torch.randint(0, 10, (max_reqs,), generator=g, dtype=torch.int32),
        "last_sampled_tokens_ptr": torch.full((max_reqs, 1), -1, dtype=torch.int64),
        "output_bin_counts_ptr": torch.randint(0, 3, (max_reqs, vocab), generator=g, dtype=torch.int32)
        if with_counts
        else None,
        "output_bin_counts_stride": vocab if with_counts else 0,
        "sampled_tokens_ptr": torch.randint(0, vocab, (num_reqs, width), generator=g, dtype=torch.int64),
        "sampled_tokens_stride": width,
        "num_sampled_ptr": torch.randint(0, width + 1, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": torch.randint(0, 2, (num_reqs,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": _qsl(torch.randint(1, 4, (num_reqs,), generator=g)) if with_qsl else None,
        "all_token_ids_ptr": torch.zeros((max_reqs, max_len), dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "total_len_ptr": torch.randint(0, 20, (max_reqs,), generator=g, dtype=torch.int32),
    }
    assert not _mismatches("_post_update_kernel", (num_reqs,), args, v2.post_update_torch)


def test_post_update_num_computed_tokens_and_expand_idx_mapping_match_vllm() -> None:
    g = torch.Generator().manual_seed(5)
    max_reqs, num_reqs = 8, 5
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    args = {
        "idx_mapping_ptr": idx,
        "num_computed_tokens_ptr": torch.randint(0, 10, (max_reqs,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": _qsl(torch.randint(1, 6, (num_reqs,), generator=g)),
    }
    assert not _mismatches(
        "_post_update_num_computed_tokens_kernel", (num_reqs,), args, v2.post_update_num_computed_tokens_torch
    )
    cu = _qsl(torch.randint(1, 4, (num_reqs,), generator=g))
    args = {
        "idx_mapping_ptr": idx,
        "expanded_idx_mapping_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int32),
        "expanded_local_pos_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int32),
        "cu_num_logits_ptr": cu,
        "BLOCK_SIZE": 4,
    }
    assert not _mismatches("_expand_idx_mapping_kernel", (num_reqs,), args, v2.expand_idx_mapping_torch)
