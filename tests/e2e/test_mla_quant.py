"""A weight-quantized (W8A16) tiny DeepSeek-V3 on the MLA backend = HF fp32 on the dequantized weights.

MLA reads ``kv_b_proj`` two ways: prefill decompresses the latent through the quantized layer, decode absorbs
its weight into the query and the output (vLLM dequantizes it for ``W_UK``/``W_UV``). With weight-only
quantization both are exact against the dequantized weights, so greedy tokens must equal HF transformers run
on a float copy of the checkpoint whose quantized weights are ``(int8 - offset) * scale``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from vllm_ascend.quant.export import export_modelslim
from vllm_ascend.testing.tiny_models import build_tiny_model

from .test_mla_deepseek import PROMPTS, _greedy, deepseek_v3_spec

MAX_NEW_TOKENS = 8


def _dequantized_copy(quantized: Path, out: Path) -> int:
    """A float checkpoint of ``quantized`` (W8A16 weights dequantized per output channel); returns how many
    weights were dequantized."""
    from safetensors.torch import load_file, save_file

    description = json.loads((quantized / "quant_model_description.json").read_text())
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(quantized.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    dequantized = 0
    for name, quant_type in description.items():
        if quant_type == "W8A16" and name.endswith(".weight") and weights[name].dtype == torch.int8:
            stem = name.removesuffix(".weight")
            scale, offset = weights.pop(f"{stem}.weight_scale"), weights.pop(f"{stem}.weight_offset")
            weights[name] = (weights[name].float() - offset) * scale
            dequantized += 1
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    config = json.loads((quantized / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config))
    extra_files = ("special_tokens_map.json", "generation_config.json")
    for path in quantized.iterdir():
        if path.name.startswith("tokenizer") or path.name in extra_files:
            shutil.copy(path, out / path.name)
    return dequantized


def test_w8a16_deepseek_v3_mla_equals_hf_dequantized(make_llm, tiny_models_root: Path, tmp_path):
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    model_dir = build_tiny_model(deepseek_v3_spec(first_k_dense_replace=1), tiny_models_root)
    quantized = tmp_path / "w8a16"
    export_modelslim(model_dir, quantized, "W8A16", progress=False)
    description = json.loads((quantized / "quant_model_description.json").read_text())
    assert description["model.layers.0.self_attn.kv_b_proj.weight"] == "W8A16"
    reference = tmp_path / "dequantized"
    assert _dequantized_copy(quantized, reference) >= 8
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(reference, prompts, MAX_NEW_TOKENS).token_ids
    assert expected != hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids  # quantization changes tokens

    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    llm = make_llm(quantized, quantization="ascend", max_num_batched_tokens=16, max_num_seqs=4)
    assert _greedy(llm, prompts) == expected
    counts = adaptor.call_counts
    assert counts["mla_prefill_attention"] > 0 and counts["mla_latent_attention"] > 0, counts
