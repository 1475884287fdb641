"""V2 prompt-embeds overlay against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import model_states_prompt_embeds as v2

from .vllm_oracle import clone_args, vllm_kernel

_KERNEL = "vllm.v1.worker.gpu.model_states.prompt_embeds._apply_prompt_embeds_kernel"


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
    num_tokens = int(qsl[-1])
    stride = hidden + 3
    args = {
        "inputs_embeds_ptr": torch.randn(num_tokens + 2, stride, generator=g).to(dtype),  # hidden < stride
        "inputs_embeds_stride": stride,
        "embeds_ptrs_ptr": embeds_ptrs,
        "mask_ptrs_ptr": mask_ptrs,
        "embeds_lens_ptr": embeds_lens,
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "num_computed_tokens_ptr": torch.randint(0, 16, (max_reqs,), generator=g, dtype=torch.int32),
        "hidden_size": hidden,
        "TOKEN_BLOCK": token_block,
        "BLOCK_SIZE": 16,
    }
    max_query = int(query_lens.max()) if num_reqs else 1
    grid = (num_reqs, -(-max_query // token_block))
    return grid, args, keep_alive


@pytest.mark.parametrize(
    ("num_reqs", "hidden", "dtype", "token_block"),
    [
        (0, 8, torch.float32, 4),
        (1, 20, torch.bfloat16, 4),
        (5, 40, torch.float16, 8),
        (6, 24, torch.float32, 2),
    ],
)
def test_apply_prompt_embeds_matches_vllm(
    num_reqs: int, hidden: int, dtype: torch.dtype, token_block: int
) -> None:
    grid, args, keep_alive = _case(num_reqs * 11 + hidden, num_reqs, hidden, dtype, token_block)
    before = args["inputs_embeds_ptr"].clone()
    expected = clone_args(args)
    vllm_kernel(_KERNEL)(grid, **expected)
    v2.apply_prompt_embeds_torch(grid, **args)
    assert torch.equal(args["inputs_embeds_ptr"], expected["inputs_embeds_ptr"])
    if num_reqs > 1:
        assert not torch.equal(args["inputs_embeds_ptr"], before)  # the case overlays something
    del keep_alive


def test_apply_prompt_embeds_respects_a_short_grid() -> None:
    grid, args, keep_alive = _case(3, 5, 16, torch.float32, 2)
    grid = (grid[0], 1)  # only the first TOKEN_BLOCK tokens of each request
    expected = clone_args(args)
    vllm_kernel(_KERNEL)(grid, **expected)
    v2.apply_prompt_embeds_torch(grid, **args)
    assert torch.equal(args["inputs_embeds_ptr"], expected["inputs_embeds_ptr"])
    del keep_alive
