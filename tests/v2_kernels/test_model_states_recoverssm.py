"""V2 RecoverSSM align postprocess against vLLM's own kernel (run in Triton's interpreter).

vLLM's kernel carries a ``@triton.heuristics`` decorator above ``@triton.jit``, which the shared oracle
does not recompile yet; it is recompiled here the same way (real ``triton`` under ``TRITON_INTERPRET=1``,
in the oracle's namespace of the module), heuristics included.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import textwrap

import pytest
import torch

from vllm_ascend.kernels.v2 import model_states_recoverssm as v2

from . import vllm_oracle
from .vllm_oracle import clone_args

_MODULE = "vllm.v1.worker.gpu.model_states.recoverssm"
_NAME = "_postprocess_recoverssm_align_kernel"


@functools.cache
def _vllm_kernel():
    namespace = dict(vllm_oracle._namespace(_MODULE))
    fn = vllm_oracle._original(importlib.import_module(_MODULE), _NAME)
    source = "\n" * (inspect.getsourcelines(fn)[1] - 1) + textwrap.dedent(inspect.getsource(fn))
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        exec(compile(source, inspect.getfile(fn), "exec"), namespace)
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return namespace[_NAME]


@pytest.mark.parametrize(("num_spec", "with_indices"), [(0, False), (1, True), (5, False), (6, True)])
def test_postprocess_recoverssm_align_matches_vllm(num_spec: int, with_indices: bool) -> None:
    g = torch.Generator().manual_seed(num_spec * 2 + with_indices)
    num_reqs, max_reqs = 8, 12
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[3] = -1
    args = {
        "idx_mapping_ptr": idx,
        "num_sampled_ptr": torch.randint(0, 4, (num_reqs,), generator=g, dtype=torch.int32),
        "request_indices_ptr": (
            torch.randperm(num_reqs, generator=g)[:num_spec].to(torch.int32) if with_indices else None
        ),
        "num_computed_ptr": torch.randint(0, 90, (num_reqs,), generator=g, dtype=torch.int32),
        "state_idx_ptr": torch.full((max_reqs,), -4, dtype=torch.int32),
        "num_accepted_ptr": torch.full((max_reqs,), 7, dtype=torch.int32),
    }
    args["num_computed_ptr"][0] = 0
    args["num_sampled_ptr"][0] = 0  # max(.., 0) clamps -1
    constants = {"MAMBA_BLOCK_SIZE": 16, "BLOCK_TABLE_WIDTH": 5}  # 90 // 16 > 4: the width clamps
    expected = clone_args(args)
    _vllm_kernel()[(num_spec,)](**expected, **constants)
    v2.postprocess_recoverssm_align_torch((num_spec,), **args, **constants)
    assert torch.equal(args["state_idx_ptr"], expected["state_idx_ptr"])
    assert torch.equal(args["num_accepted_ptr"], expected["num_accepted_ptr"])
    if num_spec > 1:
        assert (args["num_accepted_ptr"] == 1).any()
