"""Top-k routing of the MoE runner against vLLM 0.32's own torch routing (``grouped_topk``).

vLLM's ``grouped_topk`` is wrapped in ``torch.compile``; the tests call the function it wraps (the same
code, eager). Ids are compared as sets per token (vLLM does not sort them), weights per expert id.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from vllm.model_executor.layers.fused_moe.router.custom_routing_router import CustomRoutingRouter
from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import FusedTopKBiasRouter
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter, grouped_topk

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor
from vllm_ascend.runner.ops.moe_routing import check_router, select_experts

vllm_grouped_topk = inspect.unwrap(grouped_topk)
TOKENS = 64


def by_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ids ascending, with their weights."""
    order = ids.long().argsort(dim=-1)
    return ids.long().gather(1, order), weights.float().gather(1, order)


def assert_same_routing(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]):
    got_ids, got_w = by_id(*got)
    want_ids, want_w = by_id(*want)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=0)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.int32


def vllm_routing(logits, k, renormalize, groups, topk_groups, scoring, scale, bias):
    hidden = torch.empty(logits.shape[0], 1)
    return vllm_grouped_topk(hidden, logits, k, renormalize, groups, topk_groups, scoring, scale, bias)


# (num_experts, num_groups, topk_groups, k): DeepSeek-V3's shape scaled down, uneven choices, k > group size
GEOMETRIES = [(64, 8, 4, 8), (32, 4, 2, 3), (16, 4, 1, 4), (24, 3, 2, 6), (16, 8, 3, 5)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "E{}-G{}-TG{}-k{}".format(*g))
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("renormalize", "scale"), [(True, 1.0), (True, 2.5), (False, 1.0), (False, 0.5)])
def test_reference_gating_equals_vllm_grouped_topk(geometry, scoring, with_bias, renormalize, scale):
    num_experts, groups, topk_groups, k = geometry
    gen = torch.Generator().manual_seed(hash((geometry, scoring, with_bias, renormalize, scale)) % 2**31)
    logits = torch.randn(TOKENS, num_experts, generator=gen) * 2
    bias = torch.randn(num_experts, generator=gen) * 0.5 if with_bias else None
    got = ReferenceDeviceAdaptor().moe_gating_top_k(
        logits,
        k,
        renormalize=renormalize,
        scoring=scoring,
        bias=bias,
        num_groups=groups,
        topk_groups=topk_groups,
        routed_scaling_factor=scale,
    )
    want = vllm_routing(logits, k, renormalize, groups, topk_groups, scoring, scale, bias)
    assert_same_routing(got, want)


def test_the_bias_and_the_groups_change_the_choice():
    """The comparison above is not vacuous: on these inputs bias and grouping each change some token's ids."""
    gen = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(TOKENS, 32, generator=gen), torch.randn(32, generator=gen) * 0.5
    ref = ReferenceDeviceAdaptor()
    grouped = ref.moe_gating_top_k(logits, 3, scoring="sigmoid", bias=bias, num_groups=4, topk_groups=2)[1]
    all_groups = ref.moe_gating_top_k(logits, 3, scoring="sigmoid", bias=bias, num_groups=4, topk_groups=4)[1]
    unbiased = ref.moe_gating_top_k(logits, 3, scoring="sigmoid", num_groups=4, topk_groups=2)[1]
    assert not torch.equal(grouped.sort(-1).values, all_groups.sort(-1).values)
    assert not torch.equal(grouped.sort(-1).values, unbiased.sort(-1).values)


# -- routers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_grouped_router_routes_like_vllm(scoring, with_bias):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(TOKENS, 32, generator=gen)
    bias = torch.nn.Parameter(torch.randn(32, generator=gen) * 0.3) if with_bias else None
    router = GroupedTopKRouter(
        top_k=4,
        global_num_experts=32,
        num_expert_group=8,
        topk_group=3,
        renormalize=True,
        scoring_func=scoring,
        routed_scaling_factor=2.5,
        e_score_correction_bias=bias,
    )
    check_router(router, "layer")
    want = vllm_routing(logits, 4, True, 8, 3, scoring, 2.5, bias.data if bias is not None else None)
    assert_same_routing(select_experts(router, logits), want)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_bias_router_routes_like_vllm(scoring, renormalize):
    """``FusedTopKBiasRouter``: biased selection over all experts (vLLM's grouped_topk with one group)."""
    gen = torch.Generator().manual_seed(2)
    logits, bias = torch.randn(TOKENS, 16, generator=gen), torch.randn(16, generator=gen) * 0.3
    router = FusedTopKBiasRouter(
        top_k=3,
        global_num_experts=16,
        e_score_correction_bias=torch.nn.Parameter(bias),
        renormalize=renormalize,
        routed_scaling_factor=1.75,
        scoring_func=scoring,
    )
    check_router(router, "layer")
    want = vllm_routing(logits, 3, renormalize, 1, 1, scoring, 1.75, bias)
    assert_same_routing(select_experts(router, logits), want)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_plain_router_routes_like_its_formula(scoring):
    logits = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(3))
    router = FusedTopKRouter(top_k=2, global_num_experts=8, scoring_func=scoring, renormalize=False)
    check_router(router, "layer")
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    top = scores.topk(2, dim=-1)
    assert_same_routing(select_experts(router, logits), (top.values, top.indices))


def test_grouped_router_without_a_usable_grouping_falls_back_as_vllm_does():
    """8 experts in 8 groups is no grouping: vLLM routes by fused_topk (softmax, unscaled) without a bias,
    and by the biased top-k (scaled) with one."""
    logits = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(4))
    kwargs = dict(top_k=2, global_num_experts=8, num_expert_group=8, topk_group=2, scoring_func="sigmoid")
    plain = GroupedTopKRouter(**kwargs, routed_scaling_factor=3.0)
    check_router(plain, "layer")
    probs = logits.softmax(-1).topk(2, dim=-1)
    assert_same_routing(
        select_experts(plain, logits), (probs.values / probs.values.sum(-1, True), probs.indices)
    )
    bias = torch.randn(8, generator=torch.Generator().manual_seed(5))
    biased = GroupedTopKRouter(**kwargs, routed_scaling_factor=3.0, e_score_correction_bias=bias)
    check_router(biased, "layer")
    assert_same_routing(
        select_experts(biased, logits), vllm_routing(logits, 2, True, 1, 1, "sigmoid", 3.0, bias)
    )


# -- refusals ------------------------------------------------------------------------------------------
def test_other_routers_are_refused_by_name():
    router = CustomRoutingRouter(top_k=2, global_num_experts=8, custom_routing_function=lambda *a: a)
    with pytest.raises(
        NotImplementedError,
        match=r"layer\.0: .*does not support the CustomRoutingRouter router; "
        "supported: FusedTopKRouter, FusedTopKBiasRouter, GroupedTopKRouter",
    ):
        check_router(router, "layer.0")


@pytest.mark.parametrize(
    ("router", "option"),
    [
        (
            FusedTopKBiasRouter(top_k=2, global_num_experts=8, hash_indices_table=torch.zeros(16, 2)),
            "hash_indices_table",
        ),
        (
            FusedTopKBiasRouter(
                top_k=2, global_num_experts=8, e_score_correction_bias=torch.zeros(8), bias_vl=torch.zeros(8)
            ),
            "bias_vl",
        ),
        (
            FusedTopKBiasRouter(
                top_k=2,
                global_num_experts=8,
                e_score_correction_bias=torch.zeros(8),
                scoring_func="sqrtsoftplus",
            ),
            r"scoring_func='sqrtsoftplus' \(supported: softmax, sigmoid\)",
        ),
        (
            GroupedTopKRouter(
                top_k=2, global_num_experts=8, num_expert_group=2, topk_group=1, num_fused_shared_experts=1
            ),
            "num_fused_shared_experts=1",
        ),
        (
            GroupedTopKRouter(
                top_k=2, global_num_experts=8, num_expert_group=2, topk_group=1, skip_padding=True
            ),
            "skip_padding",
        ),
    ],
    ids=["hash", "bias_vl", "sqrtsoftplus", "fused-shared", "skip-padding"],
)
def test_unsupported_router_options_are_refused_by_name(router, option):
    with pytest.raises(NotImplementedError, match=f"options of the {type(router).__name__} router: {option}"):
        check_router(router, "layer.0")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_expert_group": 4, "topk_group": 5}, r"topk_groups=5 must be within \[1, num_groups=4\]"),
        ({"num_expert_group": 4, "topk_group": 1, "top_k": 5}, r"k=5 must be within \[1, 4\]"),
    ],
)
def test_bad_group_counts_are_refused_at_build(kwargs, message):
    router = GroupedTopKRouter(**{"top_k": 2, "global_num_experts": 16, **kwargs})
    with pytest.raises(DeviceOpError, match=f"layer.0: GroupedTopKRouter: {message}"):
        check_router(router, "layer.0")
