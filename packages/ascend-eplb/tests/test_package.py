"""The package surface: lazy public names, registry entries, no vLLM import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_ascend.eplb as eplb


def test_public_names_resolve():
    for name in eplb.__all__:
        assert getattr(eplb, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        eplb.nope  # noqa: B018


def test_registry_paths_match_the_classes():
    from vllm_ascend.core.registry import EPLB_POLICIES
    from vllm_ascend.eplb._extension import POLICY_PATHS, register

    register()
    for name, path in POLICY_PATHS.items():
        assert EPLB_POLICIES.get(name) is getattr(eplb, path.rsplit(":", 1)[1])


def test_policies_import_without_vllm():
    code = (
        "import sys, numpy as np; import vllm_ascend.eplb as e; "
        "p = e.PolicyFactory.generate_policy('flashlb'); "
        "p.rebalance_experts(np.array([[[0, 1], [2, 3]]]), np.ones((1, 2, 2))); "
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
