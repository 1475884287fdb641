"""Registration resolves, and importing the package pulls in neither vLLM nor the web stack."""

from __future__ import annotations

import subprocess
import sys

import vllm_ascend.netloader as netloader
from vllm_ascend.core.registry import MODEL_LOADERS
from vllm_ascend.netloader._extension import EXTENSION


def test_registered_and_resolves_with_vllm():
    EXTENSION.register()
    EXTENSION.register()  # idempotent
    assert MODEL_LOADERS.entry("netloader").value == "vllm_ascend.netloader.loader:NetLoader"
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    loader = MODEL_LOADERS.get("netloader")
    assert loader.__name__ == "NetLoader" and issubclass(loader, BaseModelLoader)


def test_lazy_exports():
    from vllm_ascend.netloader.client import SeedClient

    assert netloader.SeedClient is SeedClient
    assert "SeedServer" in dir(netloader)


def test_import_is_light():
    code = (
        "import sys, vllm_ascend.netloader; "
        "print(*[m in sys.modules for m in ('vllm', 'fastapi', 'httpx', 'torch')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False", "False"]


def test_seed_command_serves_a_checkpoint(tmp_path):
    import re
    import signal

    import torch
    from safetensors.torch import save_file

    from vllm_ascend.core.registry import CLI_COMMANDS
    from vllm_ascend.netloader.client import SeedClient

    EXTENSION.register()
    assert CLI_COMMANDS.get("netloader-seed").name == "netloader-seed"
    weights = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5, dtype=torch.int8)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_ascend.core.cli", "netloader-seed", "--checkpoint", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(
            rf"seed serving 2 tensors \(0\.0 MiB\) from {re.escape(str(tmp_path))} at (http://127\.0\.0\.1:\d+) "
            r"\(stream port \d+\); Ctrl-C stops it\n",
            line,
        )
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        with SeedClient(match.group(1)) as client:
            got = dict(client.iter_tensors())
        assert torch.equal(got["a"], weights["a"]) and torch.equal(got["b"], weights["b"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == "seed stopped\n"
    finally:
        if proc.poll() is None:
            proc.kill()
