"""``vllm-ascend demo`` (README's first command) serves the tiny model and reports a match with HF."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_command_matches_hf(tmp_path):
    env = {**os.environ, "VLLM_ASCEND_CACHE_DIR": str(tmp_path)}
    argv = [
        sys.executable,
        "-m",
        "vllm_ascend.core.cli",
        "demo",
        "--max-tokens",
        "6",
        "--cache-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert out.count("[MATCH]") == 4 and "MISMATCH" not in out
    assert "platform  ReferencePlatform (Ascend reference device (cpu))" in out
    assert "worker    NPUWorker / runner NPUModelRunner" in out
    assert "fused_infer_attention=" in out and "token ids identical to HF transformers" in out
    assert any(p.name == "models" for p in tmp_path.iterdir())  # the model was built in the given cache dir
