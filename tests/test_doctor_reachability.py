"""`vllm-ascend doctor` lists, per installed sibling, what it registered and whether vLLM reaches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def doctor_json(device: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(HF_HUB_OFFLINE="1", VLLM_ASCEND_DEVICE=device)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_doctor_marks_each_registered_entry_reached_through_vllm():
    report = doctor_json("reference")
    assert report["device"]["platform"] == "vllm_ascend.core.platform.ReferencePlatform"
    registered = {
        (ext["name"], row["registry"], row["name"]): row
        for ext in report["extensions"]
        for row in ext["registered"]
    }
    expected = {
        ("runner", "workers", "default"): "vLLM parallel_config.worker_cls",
        (
            "runner",
            "weight_transfer_engines",
            "gloo",
        ): "vLLM weight_transfer_config.backend 'gloo' on reference",
        (
            "runner",
            "weight_transfer_engines",
            "hccl",
        ): "vLLM weight_transfer_config.backend 'hccl' on A2, A3, A5, 310P",
        ("netloader", "model_loaders", "netloader"): "vLLM load_format 'netloader'",
        ("specdecode", "spec_decode_methods", "ngram"): "speculative_config.method 'ngram'",
        ("specdecode", "spec_decode_methods", "eagle3"): "speculative_config.method 'eagle3'",
        ("specdecode", "config_sections", "dynamic_spec_config"): "additional_config.dynamic_spec_config",
        ("eplb", "config_sections", "eplb_config"): "additional_config.eplb_config",
        ("ascend310p", "device_overlays", "310p"): "310P devices",
    }
    for key, via in expected.items():
        assert key in registered, (key, sorted(registered))
        assert registered[key]["reached"] is True, registered[key]
        assert via in registered[key]["via"]
    assert all(row["reached"] for row in registered.values()), registered


def test_doctor_reports_no_reachability_when_the_platform_is_off():
    report = doctor_json("off")
    assert report["device"]["platform"] is None
    assert all(ext["registered"] is None for ext in report["extensions"])
