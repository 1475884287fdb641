"""Every kernel launch type-checks in Triton's compiler front end for a GPU target (see
``lower_kernels.py``), which the interpreter-mode tests cannot show. Both run in a fresh process
without ``TRITON_INTERPRET``, which this package's conftest sets for the other tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True, timeout=900)


def test_every_kernel_lowers_for_a_gpu_target():
    proc = _python(str(HERE / "lower_kernels.py"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    summary = proc.stdout.strip().splitlines()[-1]
    launches, failed, defined = (int(n) for n in re.findall(r"\d+", summary))
    assert failed == 0 and defined >= 25 and launches >= 200, summary
    assert "never launched" not in proc.stdout


def test_the_lowering_rejects_what_the_interpreter_accepts(tmp_path):
    """A kernel reading a plain module global runs interpreted but is a compile error."""
    (tmp_path / "global_kernel.py").write_text(
        "import triton\nimport triton.language as tl\n\nSCALE = 2.0\n\n\n@triton.jit\n"
        "def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)\n"
    )
    script = (
        f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(tmp_path)!r}]\n"
        "import torch, lower_kernels, global_kernel\n"
        "lower_kernels._lower(global_kernel._scale_kernel, (torch.zeros(4), 4), {'BLOCK': 4})\n"
        "print(list(lower_kernels.lowered.values()))\n"
    )
    proc = _python("-c", script)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Cannot access global variable SCALE" in proc.stdout
