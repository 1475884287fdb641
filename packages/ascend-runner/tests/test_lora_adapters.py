"""The LoRA adapter checks (``check_adapter``) on hand-written PEFT adapter directories: a well-formed one
passes, each malformed one is refused with a message naming the file, the field or tensor and what is allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vllm_ascend.core.sdk import InvalidLoRAAdapterError
from vllm_ascend.runner.lora_adapters import check_adapter

MAX_RANK = 16
PREFIX = "base_model.model.model.layers.0"
#: q_proj 8 -> 12 and down_proj 20 -> 8; the embedding's shapes are left to vLLM.
SHAPES = {
    "model.layers.0.self_attn.q_proj": (8, 12),
    "model.layers.0.mlp.down_proj": (20, 8),
    "model.embed_tokens": None,
}
CONFIG = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"], "peft_type": "LORA"}


def _tensors(rank: int = 4) -> dict[str, torch.Tensor]:
    return {
        f"{PREFIX}.self_attn.q_proj.lora_A.weight": torch.zeros(rank, 8),
        f"{PREFIX}.self_attn.q_proj.lora_B.weight": torch.zeros(12, rank),
        f"{PREFIX}.mlp.down_proj.lora_A.weight": torch.zeros(rank, 20),
        f"{PREFIX}.mlp.down_proj.lora_B.weight": torch.zeros(8, rank),
    }


def _adapter(root: Path, config: dict | None = None, tensors: dict | None = None) -> Path:
    root.mkdir(exist_ok=True)
    (root / "adapter_config.json").write_text(json.dumps(CONFIG if config is None else config))
    save_file(_tensors() if tensors is None else tensors, root / "adapter_model.safetensors")
    return root


def _refused(adapter: Path) -> str:
    with pytest.raises(InvalidLoRAAdapterError) as info:
        check_adapter(str(adapter), MAX_RANK, SHAPES)
    return str(info.value)


def test_a_well_formed_adapter_passes_and_rank_pattern_sets_a_modules_rank(tmp_path):
    """A well-formed adapter passes; ``rank_pattern`` gives down_proj rank 2, so its rank-2 tensors pass and the
    same tensors without the pattern (the config's rank 4 applies) are refused naming that rank."""
    check_adapter(str(_adapter(tmp_path / "a")), MAX_RANK, SHAPES)
    tensors = _tensors() | {
        f"{PREFIX}.mlp.down_proj.lora_A.weight": torch.zeros(2, 20),
        f"{PREFIX}.mlp.down_proj.lora_B.weight": torch.zeros(8, 2),
    }
    adapter = _adapter(tmp_path / "b", CONFIG | {"rank_pattern": {"down_proj": 2}}, tensors)
    check_adapter(str(adapter), MAX_RANK, SHAPES)
    without_pattern = _adapter(tmp_path / "c", CONFIG, tensors)
    assert "(field 'r' / 'rank_pattern': 4) need [4, 20]" in _refused(without_pattern)


def test_missing_files_are_named(tmp_path):
    adapter = _adapter(tmp_path / "a")
    os.remove(adapter / "adapter_model.safetensors")
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_model.safetensors is missing: the adapter's weights are read "
        "from one of adapter_model.safetensors, adapter_model.bin, adapter_model.pt"
    )
    os.remove(adapter / "adapter_config.json")
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_config.json is missing: a PEFT LoRA adapter directory holds "
        "adapter_config.json and one of adapter_model.safetensors, adapter_model.bin, adapter_model.pt"
    )
    (adapter / "adapter_config.json").write_text("{r: 4")
    assert _refused(adapter).startswith(
        f"Invalid LoRA adapter: {adapter}: adapter_config.json is not valid JSON: "
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"r": "4"}, "field 'r' must be an integer in 1..16 (--max-lora-rank); got '4'"),
        ({"r": 32}, "field 'r' must be an integer in 1..16 (--max-lora-rank); got 32"),
        ({"r": True}, "field 'r' must be an integer in 1..16 (--max-lora-rank); got True"),
        ({"lora_alpha": "8"}, "field 'lora_alpha' must be a number; got '8'"),
        (
            {"target_modules": 5},
            "field 'target_modules' must be a string (a regex) or a list of module names; got 5",
        ),
        (
            {"target_modules": ["q_proj", 3]},
            "field 'target_modules' must be a string (a regex) or a list of module names; got ['q_proj', 3]",
        ),
        (
            {"rank_pattern": {"down_proj": 64}},
            "field 'rank_pattern.down_proj' must be an integer in 1..16 (--max-lora-rank); got 64",
        ),
        ({"rank_pattern": [2]}, "field 'rank_pattern' must be an object of module patterns; got [2]"),
        ({"alpha_pattern": {"q_proj": None}}, "field 'alpha_pattern.q_proj' must be a number; got None"),
        ({"use_rslora": "yes"}, "field 'use_rslora' must be true or false; got 'yes'"),
    ],
)
def test_config_fields_of_the_wrong_type_or_range(tmp_path, edit, message):
    adapter = _adapter(tmp_path / "a", CONFIG | edit)
    assert _refused(adapter) == f"Invalid LoRA adapter: {adapter}: adapter_config.json: {message}"


def test_a_missing_required_field(tmp_path):
    adapter = _adapter(tmp_path / "a", {k: v for k, v in CONFIG.items() if k != "lora_alpha"})
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_config.json: field 'lora_alpha' is missing "
        "(required: r, lora_alpha, target_modules)"
    )


@pytest.mark.parametrize(
    ("key", "shape", "need"),
    [
        (f"{PREFIX}.self_attn.q_proj.lora_B.weight", (16, 4), [12, 4]),  # out_features
        (f"{PREFIX}.mlp.down_proj.lora_A.weight", (4, 12), [4, 20]),  # in_features
    ],
)
def test_a_tensor_of_the_wrong_width(tmp_path, key, shape, need):
    adapter = _adapter(tmp_path / "a", tensors=_tensors() | {key: torch.zeros(shape)})
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_model.safetensors: tensor {key!r} has shape {list(shape)}; "
        f"the model's module and the config's rank (field 'r' / 'rank_pattern': 4) need {need}"
    )


def test_tensors_whose_rank_is_not_the_configs(tmp_path):
    adapter = _adapter(tmp_path / "a", tensors=_tensors(rank=2))
    key = f"{PREFIX}.mlp.down_proj.lora_A.weight"  # the first in the file (safetensors sorts its keys)
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_model.safetensors: tensor {key!r} has shape [2, 20]; "
        "the model's module and the config's rank (field 'r' / 'rank_pattern': 4) need [4, 20]"
    )


def test_a_target_module_the_model_lacks(tmp_path):
    key = f"{PREFIX}.self_attn.foo_proj.lora_A.weight"
    tensors = _tensors() | {key: torch.zeros(4, 8), key.replace("lora_A", "lora_B"): torch.zeros(12, 4)}
    adapter = _adapter(tmp_path / "a", tensors=tensors)
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_model.safetensors: tensor {key!r} targets module "
        "'model.layers.0.self_attn.foo_proj', which is not a LoRA-capable module of the model; allowed target "
        "modules: down_proj, embed_tokens, q_proj"
    )


def test_a_lora_a_without_its_lora_b(tmp_path):
    key = f"{PREFIX}.mlp.down_proj.lora_B.weight"
    tensors = {k: v for k, v in _tensors().items() if k != key}
    adapter = _adapter(tmp_path / "a", tensors=tensors)
    assert _refused(adapter) == (
        f"Invalid LoRA adapter: {adapter}: adapter_model.safetensors: tensor "
        f"'{PREFIX}.mlp.down_proj.lora_A.weight' has no lora_B partner"
    )


def test_fused_moe_expert_tensors_are_left_to_vllms_moe_layer(tmp_path):
    """Tensors inside a fused-MoE layer (PEFT's 3D ``experts.base_layer`` and vLLM's per-expert names) pass: vLLM's
    MoE LoRA layer checks them; a leaf the model lacks outside that layer is still refused."""
    shapes = SHAPES | {"model.layers.0.mlp.experts": None}
    tensors = _tensors() | {
        f"{PREFIX}.mlp.experts.base_layer.lora_A.weight": torch.zeros(4 * 4, 8),
        f"{PREFIX}.mlp.experts.base_layer.lora_B.weight": torch.zeros(4 * 40, 4),
        f"{PREFIX}.mlp.experts.0.gate_proj.lora_A.weight": torch.zeros(4, 8),
        f"{PREFIX}.mlp.experts.0.gate_proj.lora_B.weight": torch.zeros(20, 4),
    }
    check_adapter(str(_adapter(tmp_path / "a", tensors=tensors)), MAX_RANK, shapes)
    key = f"{PREFIX}.mlp.gates.lora_A.weight"
    outside = tensors | {key: torch.zeros(4, 8), key.replace("lora_A", "lora_B"): torch.zeros(4, 4)}
    with pytest.raises(
        InvalidLoRAAdapterError, match=r"targets module 'model.layers.0.mlp.gates', which is not"
    ):
        check_adapter(str(_adapter(tmp_path / "b", tensors=outside)), MAX_RANK, shapes)
