"""The public surface: lazy exports and a light import."""

from __future__ import annotations

import subprocess
import sys

import vllm_ascend.quant as quant
from vllm_ascend.quant.description import QuantDescription


def test_lazy_exports():
    assert quant.QuantDescription is QuantDescription
    assert "W8A8DynamicLinear" in dir(quant)


def test_import_is_light():
    code = "import sys, vllm_ascend.quant; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
