"""Fused-MoE LoRA on the runner's expert rows against float64 equations: vLLM's token -> slot mapping (through
the punica wrapper), rows grouped by the reference device's ``moe_init_routing`` under a permuted placement
with copies on another rank, the 2D (gate, up) and 3D (fused gate-up) w13 layouts and w2."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers.utils import LoRAMapping

from vllm_ascend.core.sdk import get_device_adaptor
from vllm_ascend.runner.ops.moe_lora import ExpertLoRA
from vllm_ascend.runner.punica_wrapper import AscendPunicaWrapper

#: Adapter id per token (0: none); slots hold ids 7 and 9.
TOKEN_IDS = (7, 0, 9, 9, 7, 0)
SLOTS = [7, 9]
EXPERTS, TOP_K, RANK, HIDDEN, INTER = 4, 2, 4, 12, 6


def _punica(token_ids: tuple[int, ...]) -> AscendPunicaWrapper:
    wrapper = AscendPunicaWrapper(64, 8, "cpu")
    wrapper.update_metadata(
        LoRAMapping(token_ids, token_ids, is_prefill=True), SLOTS, max_loras=2, vocab_size=32
    )
    return wrapper


def _stacked(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(len(SLOTS), EXPERTS, *shape, generator=gen)


@pytest.mark.parametrize("w13_widths", [(INTER, INTER), (2 * INTER,)], ids=["2d-gate-up", "3d-fused"])
def test_expert_rows_get_their_tokens_adapter_of_their_logical_expert(w13_widths):
    gen = torch.Generator().manual_seed(0)
    w13_a = tuple(_stacked(gen, RANK, HIDDEN) for _ in w13_widths)
    w13_b = tuple(_stacked(gen, width, RANK) for width in w13_widths)
    w2_a, w2_b = (_stacked(gen, RANK, INTER),), (_stacked(gen, HIDDEN, RANK),)
    lora = ExpertLoRA(w13_a, w13_b, w2_a, w2_b, _punica(TOKEN_IDS))
    num_tokens = len(TOKEN_IDS)
    x = torch.randn(num_tokens, HIDDEN, generator=gen)
    logical = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(num_tokens)])
    # A placement: logical expert e in local slot placement[e]; token 5's second copy on another rank (-1).
    placement = torch.tensor([2, 0, 3, 1])
    local = placement[logical]
    local[5, 1] = -1
    ids = torch.where(local < 0, EXPERTS, local)
    rows, row_idx, _counts = get_device_adaptor().moe_init_routing(x, ids, EXPERTS + 1)

    row_slots = lora.row_slots(local, logical, EXPERTS)
    assert row_slots is not None
    out13 = torch.zeros(rows.shape[0], sum(w13_widths))
    lora.add_w13(out13, rows, row_slots)
    z = torch.randn(rows.shape[0], INTER, generator=gen)
    out2 = torch.zeros(rows.shape[0], HIDDEN)
    lora.add_w2(out2, z, row_slots)

    want13 = torch.zeros(out13.shape, dtype=torch.float64)
    want2 = torch.zeros(out2.shape, dtype=torch.float64)
    for t, adapter in enumerate(TOKEN_IDS):
        for j in range(TOP_K):
            n = int(row_idx[t * TOP_K + j])
            if not adapter or local[t, j] < 0:
                continue
            s, e = SLOTS.index(adapter), int(logical[t, j])
            want13[n] = torch.cat(
                [
                    x[t].double() @ a[s, e].double().T @ b[s, e].double().T
                    for a, b in zip(w13_a, w13_b, strict=True)
                ]
            )
            want2[n] = z[n].double() @ w2_a[0][s, e].double().T @ w2_b[0][s, e].double().T
    torch.testing.assert_close(out13.double(), want13, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.double(), want2, rtol=1e-5, atol=1e-5)
    # Rows left alone: tokens without an adapter and the copy another rank computes.
    untouched = {int(row_idx[t * TOP_K + j]) for t in (1, 5) for j in range(TOP_K)}
    assert all(int(row_slots[n]) == -1 for n in untouched)
    assert int((row_slots >= 0).sum()) == 4 * TOP_K


def test_a_step_without_adapter_tokens_skips_the_expert_lora():
    gen = torch.Generator().manual_seed(1)
    weights = (_stacked(gen, RANK, HIDDEN),)
    lora = ExpertLoRA(weights, weights, weights, weights, _punica((0, 0, 0)))
    logical = torch.tensor([[0, 1], [2, 3], [1, 2]])
    assert lora.row_slots(logical, logical, EXPERTS) is None
