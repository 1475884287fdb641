"""V2 rejection-sampler overrides (flatten sampled, gather draft sampled) against vLLM's own kernels."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import spec_decode_rejection_sampler as v2

from .vllm_oracle import clone_args, vllm_kernel

_VLLM = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"


def _cu(counts: torch.Tensor) -> torch.Tensor:
    cu = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    return cu


def _check(kernel: str, grid: tuple[int, ...], args: dict, reference) -> None:
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}.{kernel}")(grid, **expected)
    reference(grid, **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name


@pytest.mark.parametrize(("seed", "num_reqs", "width"), [(0, 1, 1), (1, 5, 4), (2, 7, 3)])
def test_flatten_sampled_matches_vllm(seed: int, num_reqs: int, width: int) -> None:
    g = torch.Generator().manual_seed(seed)
    num_logits = torch.randint(1, width + 1, (num_reqs,), generator=g)
    num_sampled = torch.minimum(torch.randint(0, width + 1, (num_reqs,), generator=g), num_logits)
    cu = _cu(num_logits)
    args = {
        "flat_sampled_ptr": torch.zeros(int(cu[-1]), dtype=torch.int64),
        "sampled_ptr": torch.randint(0, 1000, (num_reqs, width), generator=g, dtype=torch.int64),
        "sampled_stride": width,
        "num_sampled_ptr": num_sampled.to(torch.int32),
        "cu_num_logits_ptr": cu,
    }
    _check("_flatten_sampled_kernel", (num_reqs,), args, v2.flatten_sampled_torch)
    if int(num_sampled.sum()):
        assert args["flat_sampled_ptr"].any()


@pytest.mark.parametrize(("seed", "num_reqs", "block"), [(0, 1, 4), (1, 4, 4), (2, 6, 8), (3, 0, 4)])
def test_gather_draft_sampled_matches_vllm(seed: int, num_reqs: int, block: int) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs, steps = 8, 3
    num_logits = torch.randint(2, steps + 2, (num_reqs,), generator=g)
    total = int(num_logits.sum())
    query_lens = num_logits + torch.randint(0, 3, (num_reqs,), generator=g)
    qsl = _cu(query_lens)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    prefill = torch.randint(5, 20, (max_reqs,), generator=g, dtype=torch.int32)
    num_tokens = int(qsl[-1])
    # Positions around the prefill boundary, so that some draft slots are placeholders.
    start_pos = (
        prefill[idx.long()]
        - (query_lens - num_logits).to(torch.int32)
        + (torch.arange(num_reqs, dtype=torch.int32) % 4 - 2)
    )
    owner = torch.repeat_interleave(torch.arange(num_reqs), query_lens)
    local_tok = torch.arange(num_tokens) - qsl[owner].long()
    positions = (start_pos[owner].long() + local_tok).to(torch.int64)
    logits_indices = torch.cat(
        [torch.arange(int(qsl[r + 1]) - int(num_logits[r]), int(qsl[r + 1])) for r in range(num_reqs)]
        or [torch.zeros(0, dtype=torch.int64)]
    )
    expanded_owner = torch.repeat_interleave(torch.arange(num_reqs), num_logits)
    local_pos = torch.arange(total) - _cu(num_logits)[expanded_owner].long()
    args = {
        "draft_sampled_ptr": torch.full((total,), -9, dtype=torch.int32),
        "pos_ptr": torch.full((total,), -9, dtype=torch.int64),
        "input_ids_ptr": torch.randint(0, 1000, (num_tokens,), generator=g, dtype=torch.int32),
        "positions_ptr": positions,
        "logits_indices_ptr": logits_indices.to(torch.int64),
        "expanded_idx_mapping_ptr": idx[expanded_owner].to(torch.int32),
        "expanded_local_pos_ptr": local_pos.to(torch.int32),
        "prefill_len_ptr": prefill,
        "num_logits": total,
        "BLOCK_SIZE": block,
    }
    grid = ((total + block - 1) // block,)
    _check("_gather_draft_sampled_kernel", grid, args, v2.gather_draft_sampled_torch)
    if num_reqs:
        assert (args["draft_sampled_ptr"] == -1).any()
