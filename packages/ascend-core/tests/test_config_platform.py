"""Through real vLLM on the reference device: NPUPlatform.check_and_update_config builds AscendConfig
from ``additional_config`` first, so a bad config is rejected with AscendConfig's own message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
        "unknown_key": {"eplb_config": {"dynamic_eplbb": True}},
        "out_of_range": {"eplb_config": {"expert_heat_collection_interval": 0}},
        "needs_ep": {"eplb_config": {"num_redundant_experts": 2}},
        "good": {"enable_kv_nz": True, "eplb_config": {"eplb_policy_type": "flashlb"}},
    }
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(lines[-1][len("RESULT ") :])

    assert (results["module"], results["platform"]) == ("vllm_ascend.core.platform", "NPUPlatform")
    assert (
        "unknown option additional_config.eplb_config.dynamic_eplbb; did you mean 'dynamic_eplb'? Allowed keys: "
        "algorithm_execution_interval, dynamic_eplb, eplb_policy_type, expert_heat_collection_interval, "
        "expert_map_path, expert_map_record_path, load_collection_phase, num_redundant_experts, "
        "num_warmup_iterations"
    ) in results["unknown_key"]["error"]
    assert (
        "additional_config.eplb_config.expert_heat_collection_interval = 0 is out of range; allowed: >= 1"
        in results["out_of_range"]["error"]
    )
    # the real VllmConfig's parallel config is checked: no --enable-expert-parallel here
    assert (
        "additional_config.eplb_config.num_redundant_experts requires expert parallelism "
        "(parallel_config.enable_expert_parallel = True, --enable-expert-parallel)"
    ) in results["needs_ep"]["error"]
    for label in ("unknown_key", "out_of_range", "needs_ep"):
        assert results[label]["ascend"] is None, label

    good = results["good"]["ascend"]
    assert good is not None, results["good"]["error"]
    assert good["enable_kv_nz"] is True and good["eplb_config"]["eplb_policy_type"] == 3
    # With the runner installed the engine config is complete; in a core-only install the platform's
    # next step (worker lookup) is the only acceptable failure.
    error = results["good"]["error"]
    assert error is None or "vllm-ascend-runner" in error, error
