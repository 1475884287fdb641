"""The public surface: lazy exports and a light import."""

from __future__ import annotations

import subprocess
import sys

import vllm_ascend.quant as quant
from vllm_ascend.quant import errors, schemes
from vllm_ascend.quant.description import QuantDescription, QuantDescriptionError


def test_lazy_exports():
    assert quant.QuantDescription is QuantDescription
    assert quant.QuantLoadError is errors.QuantLoadError and issubclass(quant.QuantLoadError, ValueError)
    assert errors.QuantDescriptionError is QuantDescriptionError
    for name in ("AscendLinearScheme", "AscendMoEScheme", "TensorSpec", "UnsupportedQuantType"):
        assert getattr(quant, name) is getattr(schemes, name)
    assert quant.get_scheme_class is schemes.get_scheme_class
    assert quant.register_scheme is schemes.register_scheme
    assert {"get_scheme_class", "QuantLoadError", "TensorSpec"} <= set(dir(quant))


def test_import_is_light():
    code = "import sys, vllm_ascend.quant; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
