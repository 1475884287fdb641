"""A tiny Qwen3-MoE through vLLM on the reference device with the runner's MoE layer: greedy tokens equal
HF transformers' without EPLB, with a static expert map holding redundant experts, and with dynamic
EPLB re-placing experts during generation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor, save_expert_map
from vllm_ascend.eplb.placement import generate_expert_map
from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_moe_spec

MAX_NEW_TOKENS = 12
PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer",
    "red green blue yellow",
)
MOE_OPS = ("moe_gating_top_k", "moe_init_routing", "grouped_matmul", "swiglu", "moe_finalize_routing")
#: Two ranks of five slots: experts 0 and 1 have a second copy on rank 1 (2 redundant experts).
REDUNDANT_PLACEMENT = [[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]]


def write_expert_map(rows: list[list[int]], num_layers: int, path: Path) -> Path:
    """Write an expert-map JSON file giving every layer the same ``[ranks][slots]`` placement."""
    table = np.broadcast_to(np.asarray(rows, dtype=np.int64), (num_layers, len(rows), len(rows[0])))
    save_expert_map(table, path)
    return path


@pytest.fixture(scope="module")
def tiny_moe(tiny_models_root: Path) -> Path:
    return build_tiny_model(qwen3_moe_spec(), tiny_models_root)


@pytest.fixture(scope="module")
def moe_prompts(tiny_moe: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_moe)
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module")
def moe_hf(tiny_moe: Path, moe_prompts: list[list[int]]) -> list[list[int]]:
    from vllm_ascend.testing.hf_reference import hf_greedy

    token_ids = hf_greedy(tiny_moe, moe_prompts, MAX_NEW_TOKENS).token_ids
    # A model that repeats one token would make the comparison meaningless.
    assert len({tuple(t) for t in token_ids}) == len(token_ids), token_ids
    assert all(len(set(t)) >= MAX_NEW_TOKENS // 2 for t in token_ids), token_ids
    return token_ids


def _generate(llm, prompts: list[list[int]]) -> tuple[list[list[int]], dict[str, int]]:
    """Greedy token ids and how often each MoE adaptor op ran meanwhile."""
    from vllm import SamplingParams

    from vllm_ascend.core.device.config import get_device_adaptor

    counts = get_device_adaptor().call_counts
    before = {op: counts[op] for op in MOE_OPS}
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], {op: counts[op] - before[op] for op in MOE_OPS}


def _moe_layers(llm) -> list:
    from vllm_ascend.runner.ops.moe import AscendMoERunner

    (layers,) = llm.apply_model(lambda model: [m for m in model.modules() if isinstance(m, AscendMoERunner)])
    return layers


def _checkpoint_w13(model_dir: Path) -> torch.Tensor:
    """``[layers, experts, 2I, H]`` gate-then-up weights as stored in the checkpoint."""
    from safetensors.torch import load_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    prefix = "model.layers.{}.mlp.experts.{}.{}_proj.weight"
    return torch.stack(
        [
            torch.stack(
                [
                    torch.cat([tensors[prefix.format(li, e, "gate")], tensors[prefix.format(li, e, "up")]])
                    for e in range(8)
                ]
            )
            for li in range(2)
        ]
    )


def _make(make_llm, model: Path, eplb_config: dict | None = None):
    options = dict(enable_expert_parallel=True)
    if eplb_config is not None:
        options["additional_config"] = {"eplb_config": eplb_config}
    return make_llm(model, **options)


def test_moe_greedy_matches_hf(make_llm, tiny_moe, moe_prompts, moe_hf):
    llm = _make(make_llm, tiny_moe)
    got, ops = _generate(llm, moe_prompts)
    assert got == moe_hf
    layers = _moe_layers(llm)
    assert len(layers) == 2
    # The runner's MoE layer replaced vLLM's; registration is idempotent (once per process).
    from vllm.model_executor.custom_op import op_registry_oot

    from vllm_ascend.runner.ops.moe import AscendMoERunner
    from vllm_ascend.runner.ops.registry import register_custom_ops

    register_custom_ops()
    assert op_registry_oot["MoERunner"] is AscendMoERunner
    # One call per MoE layer and forward step (two grouped matmuls), at least one step per new token.
    assert ops["moe_gating_top_k"] >= 2 * MAX_NEW_TOKENS and ops["grouped_matmul"] == 2 * ops["swiglu"], ops
    assert all(
        ops[op] == ops["moe_gating_top_k"] for op in ("moe_init_routing", "swiglu", "moe_finalize_routing")
    )
    routed = sum(len(p) for p in moe_prompts) + len(moe_prompts) * (MAX_NEW_TOKENS - 1)
    for layer in layers:
        assert layer.expert_map.tolist() == [list(range(8))]
        # Every real token went to top-2 experts; dummy/profile runs recorded nothing.
        assert int(layer.moe_load.sum()) == 2 * routed


def test_static_expert_map_with_redundant_experts(make_llm, tiny_moe, moe_prompts, moe_hf, tmp_path):
    path = write_expert_map(REDUNDANT_PLACEMENT, 2, tmp_path / "expert_map.json")
    llm = _make(make_llm, tiny_moe, {"expert_map_path": str(path)})
    got, ops = _generate(llm, moe_prompts)
    assert got == moe_hf
    assert ops["moe_finalize_routing"] > 0
    for layer in _moe_layers(llm):
        assert layer.expert_map.tolist() == [[0, 1, 2, 3, 4, -1, -1, -1], [3, 4, -1, -1, -1, 0, 1, 2]]
        # Rank 0 uses its own copies of experts 0 and 1 (slots 0, 1); rank 1 its own (slots 8, 9).
        assert layer.log2phy[:, :2].tolist() == [[0, 1], [8, 9]]
        weights = layer.routed_experts.w13_weight
        assert weights.shape[0] == 10 and bool((weights[0] == weights[8]).all())
        load = layer.moe_load.tolist()
        # Tokens are dealt to both ranks, so both copies of the replicated experts served tokens.
        assert load[0] + load[1] > 0 and load[8] + load[9] > 0, load


def test_dynamic_eplb_rebalances_during_generation(make_llm, tiny_moe, moe_prompts, moe_hf, tmp_path):
    path = write_expert_map(REDUNDANT_PLACEMENT, 2, tmp_path / "expert_map.json")
    eplb = {
        "dynamic_eplb": True,
        "expert_map_path": str(path),
        "expert_heat_collection_interval": 3,
        "algorithm_execution_interval": 2,
        "eplb_policy_type": "default",
        "load_collection_phase": "decode",
        "expert_map_record_path": str(tmp_path / "recorded.json"),
    }
    llm = _make(make_llm, tiny_moe, eplb)
    got, _ = _generate(llm, moe_prompts)
    layers = _moe_layers(llm)
    schedule = layers[0].eplb
    assert all(layer.eplb is schedule for layer in layers)
    assert schedule.rebalances, "dynamic EPLB never changed the placement"
    first_step, table = schedule.rebalances[0]
    assert first_step < MAX_NEW_TOKENS  # mid-generation
    initial = np.broadcast_to(np.asarray(REDUNDANT_PLACEMENT), table.shape)
    assert not np.array_equal(table, initial)
    # The layers' maps and weights follow the placement each routes by (a plan's last layers may still be
    # moving when generation ends): every slot holds its expert's weights.
    checkpoint = _checkpoint_w13(tiny_moe)
    applied = [layer.placement for layer in layers]
    assert any(not np.array_equal(p, REDUNDANT_PLACEMENT) for p in applied)
    for layer_id, layer in enumerate(layers):
        final = applied[layer_id]
        assert layer.expert_map.tolist() == generate_expert_map(final[None])[0].tolist()
        w13 = layer.routed_experts.w13_weight
        for slot, expert in enumerate(final.reshape(-1).tolist()):
            assert torch.equal(w13[slot], checkpoint[layer_id, expert]), (layer_id, slot, expert)
    # The placement dynamic EPLB computed was recorded as an expert-map file.
    recorded = expert_file_to_tensor(tmp_path / "recorded.json")[0].numpy()
    assert np.array_equal(recorded, schedule.table)
    assert got == moe_hf


@pytest.mark.parametrize(
    "eplb_config, options, match",
    [
        (
            {"dynamic_epbl": True},
            {},
            r"unknown option additional_config\.eplb_config\.dynamic_epbl; did you mean",
        ),
        ({"load_collection_phase": "mixed"}, {}, r"eplb_config\.load_collection_phase = 'mixed' is invalid"),
        (
            {"dynamic_eplb": True},
            {"enable_expert_parallel": False},
            r"dynamic_eplb requires expert parallelism",
        ),
    ],
)
def test_eplb_config_is_validated_when_vllm_builds_its_config(
    make_llm, tiny_moe, eplb_config, options, match
):
    with pytest.raises(ValueError, match=match):  # eplb's ConfigError is a ValueError
        make_llm(
            tiny_moe,
            **{"enable_expert_parallel": True, "additional_config": {"eplb_config": eplb_config}, **options},
        )
