"""LoRA over a quantized base model is refused while vLLM builds its config, naming the field."""

from __future__ import annotations

import json
import os

from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS, run_vllm_script

SCRIPT = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs

results = {}
for label, options in json.loads(sys.argv[2]).items():
    try:
        config = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, **options).create_engine_config()
        results[label] = {"error": None, "quantization": config.model_config.quantization}
    except Exception as exc:
        results[label] = {"error": str(exc), "quantization": None}
print("RESULT " + json.dumps(results))
"""

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
}


def test_lora_on_a_modelslim_checkpoint_is_refused_by_name(tmp_path):
    """The ModelSlim description selects ``quantization="ascend"``; without LoRA the config builds."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    description = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0"}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        description[f"model.layers.0.self_attn.{name}.weight"] = "FLOAT"
    for name in ("gate_proj", "up_proj", "down_proj"):
        description[f"model.layers.0.mlp.{name}.weight"] = "W8A8_DYNAMIC"
    (tmp_path / "quant_model_description.json").write_text(json.dumps(description))
    cases = {"plain": {}, "lora": {"enable_lora": True, "max_lora_rank": 8}}
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "reference", "HF_HUB_OFFLINE": "1"}
    results, output = run_vllm_script(SCRIPT, str(tmp_path), json.dumps(cases), env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]
    assert results["plain"] == {"error": None, "quantization": "ascend"}
    assert (
        "enable_lora with quantization='ascend' is not supported yet by vllm-ascend 0.1.0; allowed: None "
        "(an unquantized base model)"
    ) in results["lora"]["error"]
