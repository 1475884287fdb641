"""The extension descriptor registers a path that resolves, and the package exports lazily."""

from __future__ import annotations

import subprocess
import sys

import vllm_ascend.specdecode as specdecode
from vllm_ascend.core.registry import SPEC_DECODE_METHODS, registering_as
from vllm_ascend.specdecode._extension import EXTENSION
from vllm_ascend.specdecode.ngram import NgramProposer
from vllm_ascend.specdecode.suffix import SuffixDecodingProposer


def test_registered_path_resolves():
    with registering_as("vllm-ascend-specdecode"):
        EXTENSION.register()
        EXTENSION.register()  # idempotent
    assert SPEC_DECODE_METHODS.get("ngram") is NgramProposer
    assert SPEC_DECODE_METHODS.get("suffix") is SuffixDecodingProposer


def test_lazy_exports():
    assert specdecode.NgramProposer is NgramProposer
    assert "NgramConfigError" in dir(specdecode)
    assert specdecode.SuffixDecodingProposer is SuffixDecodingProposer
    assert {"SuffixCache", "SuffixTree", "replay", "ReplayStats"} <= set(dir(specdecode))


def test_import_is_light():
    code = "import sys, vllm_ascend.specdecode; print('vllm' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
