"""Fused-MoE LoRA on the runner's expert rows against float64 equations: vLLM's token -> slot mapping (through
the punica wrapper), rows grouped by the reference device's ``moe_init_routing`` under a permuted placement
with copies on another rank, the 2D (gate, up) and 3D (fused gate-up) w13 layouts and w2; the runner's
whole SiLU expert step with adapters; the layers' refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.lora.layers.utils import LoRAMapping
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.core.sdk import get_device_adaptor
from vllm_ascend.runner.ops.moe import AscendMoERunner
from vllm_ascend.runner.ops.moe_lora import AscendFusedMoE3DWithLoRA, AscendFusedMoEWithLoRA, ExpertLoRA
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


def _runner(
    activation: MoEActivation = MoEActivation.SILU, has_bias: bool = False, **tensors
) -> AscendMoERunner:
    """An ``AscendMoERunner`` holding only what its expert step and the LoRA layers read (vLLM's layouts:
    w13 [E, 2I, H], w2 [E, H, I]); no vLLM model around it."""
    runner = AscendMoERunner.__new__(AscendMoERunner)
    torch.nn.Module.__init__(runner)
    runner.layer_name = "model.layers.0.mlp.experts"
    runner.moe_load = None
    runner.expert_lora = None
    runner.routed_experts = SimpleNamespace(
        activation=activation,
        quant_method=UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod),
        **tensors,
    )
    runner.moe_config = SimpleNamespace(has_bias=has_bias, ep_size=1, dp_size=1, is_act_and_mul=True)
    return runner


def test_the_runners_expert_step_adds_both_deltas_around_the_activation():
    """``_expert_rows`` with adapter rows: ``silu(g) * u`` of ``x W13^T + x A13^T B13^T`` (gate and up), then
    ``a W2^T + a A2^T B2^T``, per row with its token's adapter of its expert; rows without one stay base."""
    gen = torch.Generator().manual_seed(2)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.3
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.3
    runner = _runner(w13_weight=w13, w2_weight=w2)
    w13_a = tuple(_stacked(gen, RANK, HIDDEN) * 0.3 for _ in range(2))
    w13_b = tuple(_stacked(gen, INTER, RANK) * 0.3 for _ in range(2))
    w2_a, w2_b = (_stacked(gen, RANK, INTER) * 0.3,), (_stacked(gen, HIDDEN, RANK) * 0.3,)
    runner.expert_lora = ExpertLoRA(w13_a, w13_b, w2_a, w2_b, _punica(TOKEN_IDS))
    x = torch.randn(len(TOKEN_IDS), HIDDEN, generator=gen)
    logical = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in TOKEN_IDS])
    rows, row_idx, counts = get_device_adaptor().moe_init_routing(x, logical, EXPERTS)
    row_slots = runner.expert_lora.row_slots(logical, logical, EXPERTS)
    assert row_slots is not None

    out = runner._expert_rows(rows, counts, row_slots)

    for t, adapter in enumerate(TOKEN_IDS):
        for j in range(TOP_K):
            e, xt = int(logical[t, j]), x[t].double()
            h = xt @ w13[e].double().T
            if adapter:
                s = SLOTS.index(adapter)
                h += torch.cat(
                    [xt @ a[s, e].double().T @ b[s, e].double().T for a, b in zip(w13_a, w13_b, strict=True)]
                )
            act = torch.nn.functional.silu(h[:INTER]) * h[INTER:]
            want = act @ w2[e].double().T
            if adapter:
                want += act @ w2_a[0][s, e].double().T @ w2_b[0][s, e].double().T
            torch.testing.assert_close(out[int(row_idx[t * TOP_K + j])].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [AscendFusedMoEWithLoRA, AscendFusedMoE3DWithLoRA])
def test_the_lora_layers_refuse_what_the_expert_rows_do_not_serve_by_name(layer):
    runner = _runner(MoEActivation.SWIGLUOAI, has_bias=True)
    runner.moe_config.ep_size = 2
    with pytest.raises(NotImplementedError) as refused:
        layer(runner)
    assert str(refused.value) == (
        "model.layers.0.mlp.experts: fused-MoE LoRA on Ascend does not support expert parallelism (ep_size=2; "
        "allowed: 1), activation swigluoai (allowed: silu), expert biases (allowed: none)"
    )


def test_vllms_from_layer_picks_the_ascend_layers_for_the_runner_only():
    """After the op registry ran, vLLM's class list starts with the Ascend layers; they accept only
    ``AscendMoERunner`` (2D: the gate and up pair; 3D: fused gate-up) and carry vLLM's class names."""
    import vllm.lora.utils as lora_utils

    from vllm_ascend.runner.ops.registry import register_custom_ops

    register_custom_ops()
    assert lora_utils._all_lora_classes[:2] == (AscendFusedMoEWithLoRA, AscendFusedMoE3DWithLoRA)
    runner = _runner()
    assert AscendFusedMoEWithLoRA.can_replace_layer(runner, None, ["w1", "w3"])
    assert not AscendFusedMoEWithLoRA.can_replace_layer(runner, None, ["w13"])
    assert AscendFusedMoE3DWithLoRA.can_replace_layer(runner, None, ["w13"])
    assert not AscendFusedMoE3DWithLoRA.can_replace_layer(torch.nn.Linear(2, 2), None, ["w13"])
    assert (AscendFusedMoEWithLoRA.__name__, AscendFusedMoE3DWithLoRA.__name__) == (
        "FusedMoEWithLoRA",
        "FusedMoE3DWithLoRA",
    )
