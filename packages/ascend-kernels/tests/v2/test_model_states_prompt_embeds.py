"""V2 prompt-embeds overlay: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import model_states_prompt_embeds as triton_impl
from vllm_ascend.kernels.v2 import model_states_prompt_embeds as v2


def _case(seed: int, num_reqs: int, hidden: int, dtype: torch.dtype, token_block: int):
    g = torch.Generator().manual_seed(seed)
    max_reqs = 6
    keep_alive: list[torch.Tensor] = []
    embeds_ptrs = torch.zeros(max_reqs, dtype=torch.uint64)
    mask_ptrs = torch.zeros(max_reqs, dtype=torch.uint64)
    embeds_lens = torch.zeros(max_reqs, dtype=torch.int32)
    for s in range(max_reqs):
        if s % 3 == 2:
            continue  # no prompt embeds
        length = int(torch.randint(1, 20, (1,), generator=g))
        embeds = torch.randn(length, hidden, generator=g).to(dtype)
        keep_alive.append(embeds)
        embeds_ptrs[s] = embeds.data_ptr()
        embeds_lens[s] = length
        if s % 2 == 0:
            mask = torch.randint(0, 2, (length,), generator=g, dtype=torch.uint8)
            keep_alive.append(mask)
            mask_ptrs[s] = mask.data_ptr()
    query_lens = torch.randint(1, 12, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    stride = hidden + 3
    args = {
        "inputs_embeds_ptr": torch.randn(int(qsl[-1]) + 2, stride, generator=g).to(dtype),
        "inputs_embeds_stride": stride,
        "embeds_ptrs_ptr": embeds_ptrs,
        "mask_ptrs_ptr": mask_ptrs,
        "embeds_lens_ptr": embeds_lens,
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "num_computed_tokens_ptr": torch.randint(0, 16, (max_reqs,), generator=g, dtype=torch.int32),
        "hidden_size": hidden,
        "TOKEN_BLOCK": token_block,
        "BLOCK_SIZE": 1024,
    }
    max_query = int(query_lens.max()) if num_reqs else 1
    return (num_reqs, -(-max_query // token_block)), args, keep_alive


@pytest.mark.parametrize(
    ("num_reqs", "hidden", "dtype", "token_block", "short_grid"),
    [
        (0, 8, torch.float32, 4, False),
        (1, 20, torch.bfloat16, 4, False),
        (5, 100, torch.float16, 16, False),
        (6, 24, torch.float32, 2, False),
        (6, 24, torch.float32, 2, True),
    ],
)
def test_apply_prompt_embeds(
    num_reqs: int, hidden: int, dtype: torch.dtype, token_block: int, short_grid: bool
) -> None:
    grid, args, keep_alive = _case(num_reqs * 11 + hidden, num_reqs, hidden, dtype, token_block)
    if short_grid:
        grid = (grid[0], 1)
    before = args["inputs_embeds_ptr"].clone()
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.apply_prompt_embeds_torch(grid, **ref)
    triton_impl.apply_prompt_embeds(grid, **args)
    assert torch.equal(args["inputs_embeds_ptr"], ref["inputs_embeds_ptr"])
    if num_reqs > 1:
        assert not torch.equal(ref["inputs_embeds_ptr"], before)
    del keep_alive
