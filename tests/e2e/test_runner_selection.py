"""Which model runner vLLM selects with the plugin: vLLM's own decision (``VllmConfig.use_v2_model_runner``),
now that V2's kernels run on this platform — V2 by default, V1 where vLLM falls back (the suffix method,
``VLLM_USE_V2_MODEL_RUNNER=0``), on every family whose worker serves V2, a family without Triton (310P:
V2's kernels run their torch references there) included.
Each case builds vLLM's engine config in a process of its own (vLLM picks its platform once per process), forked
from a warm interpreter that imported vLLM under the case's family (``script_host``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllm_ascend.testing.script_host import shared_script_host

SCRIPT = r"""
import json, sys
spec = json.loads(sys.argv[1])
from vllm.engine.arg_utils import EngineArgs
try:
    config = EngineArgs(model=spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=256,
                        **spec["options"]).create_engine_config()
except Exception as exc:
    print("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
else:
    print("RESULT " + json.dumps({
        "v2": config.use_v2_model_runner,
        "async": config.scheduler_config.async_scheduling,
        "worker": config.parallel_config.worker_cls,
    }))
"""

#: Several configs in one interpreter, each under its own environment (``env`` entries set, ``None`` unset;
#: the device caches dropped, as when a test switches the emulated family).
SEQUENCE_SCRIPT = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs
from vllm_ascend.core.device.config import clear_device_caches
results = []
for spec in json.loads(sys.argv[1]):
    for name, value in spec["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    clear_device_caches()
    config = EngineArgs(model=spec["model"], dtype=spec["dtype"], max_model_len=256).create_engine_config()
    results.append(config.use_v2_model_runner)
print("RESULT " + json.dumps(results))
"""


def _select(model: Path, env: dict[str, str] | None = None, dtype: str = "float32", **options) -> dict:
    environ = {**os.environ, "VLLM_ASCEND_DEVICE": "reference", **(env or {})}
    if env is None or "VLLM_USE_V2_MODEL_RUNNER" not in env:
        environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    spec = {"model": str(model), "options": options, "dtype": dtype}
    result, output = shared_script_host().run(SCRIPT, json.dumps(spec), env=environ, timeout=240)
    assert result is not None, output[-4000:]
    return result


def test_v2_is_vllms_default_with_async_scheduling(tiny_qwen3):
    assert _select(tiny_qwen3) == {
        "v2": True,
        "async": True,
        "worker": "vllm_ascend.runner.worker.NPUWorker",
    }


@pytest.mark.parametrize(
    ("env", "options", "v2"),
    [
        ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, {}, False),
        ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, {}, True),
        ({}, {"speculative_config": {"method": "suffix", "num_speculative_tokens": 2}}, False),
    ],
    ids=["env-0", "env-1", "suffix-falls-back"],
)
def test_vllm_decides_the_runner(tiny_qwen3, env, options, v2):
    assert _select(tiny_qwen3, env, **options)["v2"] is v2


def test_310p_gets_v2_without_triton_and_v1_where_vllm_falls_back(tiny_qwen3):
    family = {"VLLM_ASCEND_REFERENCE_FAMILY": "310p"}
    on_310p = _select(tiny_qwen3, family, dtype="float16")
    assert on_310p["v2"] is True, on_310p
    assert on_310p["worker"] == "vllm_ascend.ascend310p.worker.NPUWorker310", on_310p
    assert _select(tiny_qwen3, {**family, "VLLM_USE_V2_MODEL_RUNNER": "0"}, dtype="float16")["v2"] is False
    suffix = {"method": "suffix", "num_speculative_tokens": 2}
    assert _select(tiny_qwen3, family, dtype="float16", speculative_config=suffix)["v2"] is False


def test_the_runner_follows_each_config_in_one_process(tiny_qwen3):
    """vLLM loads plugins once per process; the answer to its Triton check is given again for every config (from
    the family's worker), so switching families in one process keeps V2 on each: 310P (no Triton), the
    reference device, 310P again."""
    environ = {**os.environ, "VLLM_ASCEND_DEVICE": "reference"}
    environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    on_310p = {"env": {"VLLM_ASCEND_REFERENCE_FAMILY": "310p"}, "dtype": "float16", "model": str(tiny_qwen3)}
    on_reference = {
        "env": {"VLLM_ASCEND_REFERENCE_FAMILY": None},
        "dtype": "float32",
        "model": str(tiny_qwen3),
    }
    specs = [on_310p, on_reference, on_310p]
    result, output = shared_script_host().run(SEQUENCE_SCRIPT, json.dumps(specs), env=environ, timeout=240)
    assert result == [True, True, True], output[-4000:]
