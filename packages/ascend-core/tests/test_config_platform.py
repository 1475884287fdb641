"""Through real vLLM on the reference device: the platform's check_and_update_config builds AscendConfig
from ``additional_config`` first, so a bad or refused option is rejected with AscendConfig's own message."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS, run_vllm_script

pytest.importorskip("vllm")

SCRIPT = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm_ascend.core.config import clear_ascend_config, get_ascend_config

results = {"platform": type(current_platform).__qualname__, "module": type(current_platform).__module__}
for label, additional in json.loads(sys.argv[2]).items():
    clear_ascend_config()
    try:
        config = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, additional_config=additional).create_engine_config()
        error = None
    except Exception as exc:
        error = str(exc)
    try:
        ascend = get_ascend_config().to_dict()
    except RuntimeError:
        ascend = None
    results[label] = {"error": error, "ascend": ascend}
print("RESULT " + json.dumps(results))
"""

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
}


def test_platform_rejects_bad_additional_config_with_the_config_message(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    cases = {
        "unknown_key": {"enable_cpu_bindng": True},
        "refused_option": {"enable_kv_nz": True},
        "refused_value": {"rejection_sampler_config": {"posterior_threshold": 2}},
        "good": {"enable_cpu_binding": True},
    }
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    results, output = run_vllm_script(SCRIPT, str(model), json.dumps(cases), env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]

    assert (results["module"], results["platform"]) == ("vllm_ascend.core.platform", "ReferencePlatform")
    assert (
        "unknown option additional_config.enable_cpu_bindng; did you mean 'enable_cpu_binding'? Allowed keys: "
        "dump_config_path, enable_cpu_binding, rejection_sampler_config, rl_config"
    ) in results["unknown_key"]["error"]
    assert (
        "`additional_config.enable_kv_nz` is not supported yet by vllm-ascend 0.1.0 "
        "(the KV cache in FRACTAL_NZ layout); remove it from additional_config"
    ) in results["refused_option"]["error"]
    assert (
        "additional_config.rejection_sampler_config.posterior_threshold = 2.0 is out of range; allowed: > 0 and <= 1"
    ) in results["refused_value"]["error"]
    for label in ("unknown_key", "refused_option", "refused_value"):
        assert results[label]["ascend"] is None, label

    good = results["good"]["ascend"]
    assert good is not None, results["good"]["error"]
    assert good["enable_cpu_binding"] is True
    # With the runner installed the engine config is complete; in a core-only install the platform's
    # next step (worker lookup) is the only acceptable failure.
    error = results["good"]["error"]
    assert error is None or "vllm-ascend-runner" in error, error


RL_SCRIPT = r"""
import json, os, sys
from argparse import Namespace
from fastapi import FastAPI
from vllm.engine.arg_utils import EngineArgs

rl = {"enabled": True, "enable_batch_invariant": True, "sleep_mode_extra_cleanup": True}
results = {}
for label, sleep in (("no_sleep_mode", False), ("served", True)):
    try:
        config = EngineArgs(
            model=sys.argv[1], skip_tokenizer_init=True, enable_sleep_mode=sleep, additional_config={"rl_config": rl}
        ).create_engine_config()
        error = None
    except Exception as exc:
        config, error = None, str(exc)
    results[label] = {
        "error": error,
        "env": [os.environ.get(name) for name in ("VLLM_SERVER_DEV_MODE", "VLLM_ASCEND_BATCH_INVARIANT")],
    }
# vLLM's API server builds its routes after the engine config, as `vllm serve` does
from vllm.entrypoints.launchers.api_server.routers import register_api_routers

app = FastAPI()
app.state.args = Namespace()
register_api_routers(Namespace(), app, ("generate",), config.model_config if config else None)
results["routes"] = sorted(getattr(route, "path", "") for route in app.routes)
print("RESULT " + json.dumps(results))
"""


def test_rl_config_through_vllm_serves_the_rl_routes(tmp_path):
    """``rl_config.enabled`` is applied while vLLM builds its engine config, so the API server built afterwards
    has vLLM's sleep / wake-up and weight-transfer routes; a refused combination switches nothing on."""
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("VLLM_SERVER_DEV_MODE", "VLLM_ASCEND_BATCH_INVARIANT")
        },
        "VLLM_ASCEND_DEVICE": "reference",
        "HF_HUB_OFFLINE": "1",
    }
    results, output = run_vllm_script(RL_SCRIPT, str(model), "{}", env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]
    refused = results["no_sleep_mode"]
    assert refused["env"] == [None, None]
    assert (
        "additional_config.rl_config.sleep_mode_extra_cleanup=true needs model_config.enable_sleep_mode=True"
    ) in refused["error"]
    served = results["served"]
    assert served["error"] is None or "vllm-ascend-runner" in served["error"], served["error"]
    assert served["env"] == ["1", "1"]
    assert {"/sleep", "/wake_up", "/is_sleeping"} <= set(results["routes"]), results["routes"]


PARALLEL_SCRIPT = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs

results = {}
for label, options in json.loads(sys.argv[2]).items():
    try:
        EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, **options).create_engine_config()
        results[label] = None
    except Exception as exc:
        results[label] = str(exc)
print("RESULT " + json.dumps(results))
"""


def test_platform_refuses_context_parallelism_by_name(tmp_path):
    """Decode context parallelism passes vLLM's own checks when TP exceeds the KV heads (here 4 > 2);
    the platform must then refuse it, naming the option and the supported value."""
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    cases = {"dcp": {"tensor_parallel_size": 4, "decode_context_parallel_size": 2}}
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "reference", "HF_HUB_OFFLINE": "1"}
    results, output = run_vllm_script(PARALLEL_SCRIPT, str(model), json.dumps(cases), env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]
    assert (
        "decode_context_parallel_size=2 is not supported yet by vllm-ascend 0.1.0; supported: 1"
    ) in results["dcp"]


V2_SCRIPT = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs

results = {}
for value in json.loads(sys.argv[2]):
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = value
    try:
        config = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True).create_engine_config()
        results[value] = {"error": None, "v2": config.use_v2_model_runner}
    except Exception as exc:
        results[value] = {"error": str(exc), "v2": None}
print("RESULT " + json.dumps(results))
"""


def test_model_runner_v2_is_vllms_choice_or_refused_by_name(tmp_path):
    """``VLLM_USE_V2_MODEL_RUNNER`` is vLLM's: with the runner installed, ``1`` selects V2 and ``0`` V1; this
    package alone serves nothing, and says which distribution is missing."""
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    results, output = run_vllm_script(V2_SCRIPT, str(model), json.dumps(["1", "0"]), env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]
    runner_installed = importlib.util.find_spec("vllm_ascend.runner") is not None
    if runner_installed:
        assert results["1"] == {"error": None, "v2": True}, results
        assert results["0"] == {"error": None, "v2": False}, results
    else:
        error = results["1"]["error"]
        # refused by name: the platform names the missing runner before anything is served
        assert error is not None and "vllm-ascend-runner" in error, error
        error = results["0"]["error"]
        assert error is None or "vllm-ascend-runner" in error, error
        assert results["0"]["v2"] in (False, None)


def test_platform_refuses_the_lora_configurations_not_served_by_name(tmp_path):
    """LoRA is served on unquantized models (dense or MoE), at TP 2 and with captured graphs too; the rest is
    refused at config time, naming the field and the allowed values (every refusal of one config in its message)."""
    dense = tmp_path / "tiny-llama"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(MODEL_CONFIG))
    moe = tmp_path / "tiny-qwen3-moe"
    moe.mkdir()
    moe_config = {
        **MODEL_CONFIG,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "head_dim": 16,
    }
    (moe / "config.json").write_text(json.dumps(moe_config))
    lora = {"enable_lora": True, "max_lora_rank": 8}
    cases = {
        "served": {**lora},
        "tp2": {**lora, "tensor_parallel_size": 2},
        "graphs": {**lora, "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
        "tp2_graphs": {
            **lora,
            "tensor_parallel_size": 2,
            "compilation_config": {"cudagraph_mode": "PIECEWISE"},
        },
    }
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "reference", "HF_HUB_OFFLINE": "1"}
    results, output = run_vllm_script(PARALLEL_SCRIPT, str(dense), json.dumps(cases), env=env, timeout=540)
    assert results is not None, output[-OUTPUT_TAIL_CHARS:]
    # Served: nothing refused (in core's own venv the runner sibling is absent, which is all it may say).
    for name in cases:
        assert results[name] is None or "vllm-ascend-runner" in results[name], (name, results[name])
    moe_cases = {
        "moe": lora,
        "moe_ep_shared": {**lora, "enable_expert_parallel": True, "enable_moe_shared_loras": True},
        "moe_dp2": {**lora, "data_parallel_size": 2},
    }
    moe_results, output = run_vllm_script(
        PARALLEL_SCRIPT, str(moe), json.dumps(moe_cases), env=env, timeout=540
    )
    assert moe_results is not None, output[-OUTPUT_TAIL_CHARS:]
    # Fused-MoE LoRA is served; expert/data parallelism and vLLM's shared-outer MoE adapters are refused.
    assert moe_results["moe"] is None or "vllm-ascend-runner" in moe_results["moe"], moe_results["moe"]
    refusal = (
        "enable_lora with {} on a mixture-of-experts model (Qwen3MoeForCausalLM) is not supported yet by "
    )
    refusal += "vllm-ascend 0.1.0; allowed: {}"
    assert (
        refusal.format("parallel_config.enable_expert_parallel=True", "False") in moe_results["moe_ep_shared"]
    )
    assert refusal.format("lora_config.enable_moe_shared_loras=True", "False") in moe_results["moe_ep_shared"]
    assert refusal.format("parallel_config.data_parallel_size=2", "1") in moe_results["moe_dp2"]
