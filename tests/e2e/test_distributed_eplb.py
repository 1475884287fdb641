"""Dynamic EPLB across two expert-parallel ranks (TP=2 + expert parallel, vLLM's multiprocess executor, gloo):
a tiny Qwen3-MoE whose router favours the experts vLLM loads on rank 0. While it generates, the ranks
gather their loads, rank 0's background policy plans, both ranks adopt the plan and move expert weights
to each other (D2D over the process group) one layer per forward. Greedy tokens equal HF's throughout."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from .distributed import run_case
from .test_distributed_moe import PROMPTS

MAX_TOKENS = 32
HOT = 4.0  # router rows of experts 0-3 (loaded on rank 0) scaled by this: they win most top-2 choices


@pytest.fixture(scope="module")
def skewed_moe(tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("skewed") / "qwen3-moe-skewed"
    shutil.copytree(tiny_qwen3_moe, out)
    weights = load_file(out / "model.safetensors")
    for name, tensor in weights.items():
        if name.endswith("mlp.gate.weight"):
            tensor[:4] *= HOT
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _expert_sums(model: Path) -> np.ndarray:
    """``[layers, experts]`` sum of each expert's gate and up projections (what a w13 slot sums to)."""
    weights = load_file(model / "model.safetensors")
    config = json.loads((model / "config.json").read_text())
    return np.array(
        [
            [
                float(
                    weights[f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight"].double().sum()
                    + weights[f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight"].double().sum()
                )
                for e in range(config["num_local_experts"])
            ]
            for layer in range(config["num_hidden_layers"])
        ]
    )


def test_dynamic_eplb_moves_experts_between_ranks_while_serving(skewed_moe, tmp_path):
    from transformers import AutoTokenizer

    from vllm_ascend.eplb.placement import generate_expert_map
    from vllm_ascend.testing.hf_reference import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(skewed_moe)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(skewed_moe, prompts, MAX_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    eplb = {
        "dynamic_eplb": True,
        "eplb_policy_type": "swift",
        "expert_heat_collection_interval": 4,
        "algorithm_execution_interval": 1,
        "num_warmup_iterations": 0,
        "expert_map_record_path": str(tmp_path / "recorded.json"),
    }
    result, output = run_case(
        skewed_moe,
        prompts,
        max_tokens=MAX_TOKENS,
        report=True,
        tensor_parallel_size=2,
        enable_expert_parallel=True,
        additional_config={"eplb_config": eplb},
    )
    assert "Traceback" not in output, output[-6000:]
    assert result["tokens"] == expected  # the same tokens before, between and after the moves
    reports = sorted(result["reports"], key=lambda r: r["rank"])
    first, second = reports
    # Both ranks applied the same plans at the same forwards; experts moved at least twice.
    assert first["rebalances"] == second["rebalances"]
    rebalances = first["rebalances"]
    assert len(rebalances) >= 2, output[-6000:]
    loaded = np.arange(8).reshape(1, 2, 4).repeat(2, axis=0)  # vLLM's linear placement: rank r, experts 4r..
    tables = [loaded] + [np.asarray(table) for _, table in rebalances]
    for before, after in itertools.pairwise(tables):
        assert (np.sort(after, axis=2) != np.sort(before, axis=2)).any()  # an expert changed rank
    assert rebalances[0][0] < first["steps"]  # while serving: more forwards followed the first move
    # Every slot holds its expert's weights, and each rank routes by the final placement.
    final = np.asarray(first["table"])
    sums = _expert_sums(skewed_moe)
    for report in reports:
        rank = report["rank"]
        for layer, slot_sums in enumerate(report["w13_sums"]):
            np.testing.assert_allclose(slot_sums, sums[layer, final[layer, rank]], rtol=1e-6, atol=1e-6)
        for layer, expert_map in enumerate(report["expert_maps"]):
            assert expert_map == generate_expert_map(final[layer][None])[0].tolist()
    # Rank 0 reports the per-rank imbalance measured before each plan and the one the plan predicts.
    plans = re.findall(
        r"EPLB plan at step (\d+): per-rank load max/mean ([\d.]+) measured, ([\d.]+) with", output
    )
    assert len(plans) >= 2, output[-6000:]
    measured, predicted = float(plans[0][1]), float(plans[0][2])
    assert measured > 1.2 and predicted < measured
    windows = first["windows"]
    assert windows[0][1] == pytest.approx(measured, abs=1e-3)
    assert min(w[1] for w in windows[1:]) < measured  # measured again after the moves: better balanced
    recorded = json.loads((tmp_path / "recorded.json").read_text())
    assert recorded["moe_layer_count"] == 2
    assert torch.equal(
        torch.tensor(
            [[d["device_expert"] for d in layer["device_list"]] for layer in recorded["layer_list"]]
        ),
        torch.as_tensor(final),
    )
