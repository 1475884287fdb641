"""Grouped top-k routing served by the runner's MoE layer: a tiny GLM-4.5 (sigmoid scores,
``e_score_correction_bias``, 16 experts in 4 groups of which 2 are kept, top-3, routed scaling 2.5, a shared
expert) through vLLM on the reference device; greedy tokens equal to HF transformers', and the layer's
routing equal to HF's router on the model's own router logits, with the groups and the bias both mattering."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_ascend.testing.tiny_models import (
    GLM4_MOE_NUM_GROUPS,
    GLM4_MOE_ROUTED_SCALING,
    GLM4_MOE_TOPK_GROUPS,
    build_tiny_model,
    glm4_moe_spec,
)

MAX_NEW_TOKENS = 12
PROMPTS = ("the quick ascend kernel", "river mountain forest ocean cloud rain", "red green blue yellow")


@pytest.fixture(scope="module")
def tiny_glm4_moe(tiny_models_root: Path) -> Path:
    return build_tiny_model(glm4_moe_spec(), tiny_models_root)


@pytest.fixture(scope="module")
def prompts(tiny_glm4_moe: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_glm4_moe)
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module")
def llm(tiny_glm4_moe: Path):
    """One engine for the module (the ``make_llm`` settings: fp32, block 16, 64 MiB KV cache)."""
    from vllm import LLM

    engine = LLM(
        model=str(tiny_glm4_moe),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def _moe_routers(llm) -> list[tuple[object, float]]:
    """``(router, runner's output scale)`` of every MoE layer of the served model, in layer order."""
    from vllm_ascend.runner.ops.moe import AscendMoERunner

    (routers,) = llm.apply_model(
        lambda model: [
            (m.router, m.routed_scaling_factor) for m in model.modules() if isinstance(m, AscendMoERunner)
        ]
    )
    return routers


@torch.inference_mode()
def _hf_routing(
    model_dir: Path, prompts: list[list[int]]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per MoE layer, HF's ``(router logits, weights, ids)`` over all prompt tokens."""
    from transformers import AutoModelForCausalLM
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gates = [m for m in model.modules() if isinstance(m, Glm4MoeTopkRouter)]
    seen: dict[int, list[tuple[torch.Tensor, ...]]] = {i: [] for i in range(len(gates))}
    hooks = [
        gate.register_forward_hook(lambda _m, _i, out, i=i: seen[i].append(tuple(out)))
        for i, gate in enumerate(gates)
    ]
    for prompt in prompts:
        model(input_ids=torch.tensor([prompt]))
    for hook in hooks:
        hook.remove()
    return [tuple(torch.cat([step[j] for step in seen[i]]) for j in range(3)) for i in range(len(gates))]


def _id_sets(ids: torch.Tensor) -> torch.Tensor:
    return ids.long().sort(dim=-1).values


def test_layers_route_like_hf_and_the_groups_and_bias_matter(llm, tiny_glm4_moe, prompts):
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter

    from vllm_ascend.runner.ops.moe_routing import select_experts

    routers = _moe_routers(llm)
    hf_layers = _hf_routing(tiny_glm4_moe, prompts)
    assert len(routers) == len(hf_layers) == 2  # layer 0 is dense
    for (router, output_scale), (logits, hf_weights, hf_ids) in zip(routers, hf_layers, strict=True):
        assert type(router) is GroupedTopKRouter and router.scoring_func == "sigmoid"
        assert (router.num_expert_group, router.topk_group) == (GLM4_MOE_NUM_GROUPS, GLM4_MOE_TOPK_GROUPS)
        # GLM-4.5 asks vLLM to scale the MoE output: the router's factor is 1, the runner's 2.5
        assert router.routed_scaling_factor == 1.0 and output_scale == GLM4_MOE_ROUTED_SCALING
        bias = router.e_score_correction_bias.data
        assert bias.abs().min() > 0
        weights, ids = select_experts(router, logits)
        assert torch.equal(_id_sets(ids), _id_sets(hf_ids))
        order, hf_order = ids.long().argsort(-1), hf_ids.long().argsort(-1)
        torch.testing.assert_close(
            weights.gather(1, order) * output_scale, hf_weights.gather(1, hf_order), atol=1e-5, rtol=1e-5
        )
        all_groups = GroupedTopKRouter(
            top_k=router.top_k,
            global_num_experts=router.global_num_experts,
            num_expert_group=router.num_expert_group,
            topk_group=router.num_expert_group,
            scoring_func="sigmoid",
            e_score_correction_bias=bias,
        )
        unbiased = GroupedTopKRouter(
            top_k=router.top_k,
            global_num_experts=router.global_num_experts,
            num_expert_group=router.num_expert_group,
            topk_group=router.topk_group,
            scoring_func="sigmoid",
        )
        for other in (all_groups, unbiased):
            assert not torch.equal(_id_sets(select_experts(other, logits)[1]), _id_sets(ids))


def test_greedy_tokens_match_hf(llm, tiny_glm4_moe, prompts):
    from vllm import SamplingParams

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    expected = hf_greedy(tiny_glm4_moe, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected  # the prompts' continuations differ
    counts = get_device_adaptor().call_counts
    before = counts["moe_gating_top_k"]
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    assert counts["moe_gating_top_k"] - before >= 2 * MAX_NEW_TOKENS  # two MoE layers, every step
