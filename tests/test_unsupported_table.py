"""The core README's table of refused options is exactly what the code refuses."""

from __future__ import annotations

import pathlib
import re

from vllm_ascend.core import envs
from vllm_ascend.core.config import UNSUPPORTED_OPTIONS, RejectionSamplerConfig

README = pathlib.Path(__file__).resolve().parents[1] / "packages/ascend-core/README.md"


def table_options() -> set[str]:
    section = README.read_text().split("## Refused options", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)`", section, re.MULTILINE)}


def test_readme_table_lists_every_refused_option_and_variable():
    expected = {f"additional_config.{key}" for key in UNSUPPORTED_OPTIONS} | set(envs.UNSUPPORTED)
    refused_methods = {"block", "entropy"} - set(RejectionSamplerConfig.SUPPORTED)
    if refused_methods:
        expected.add("additional_config.rejection_sampler_config.verify_method")
    assert table_options() == expected


def test_refused_variables_are_not_declared():
    assert not set(envs.UNSUPPORTED) & set(envs.variables())
