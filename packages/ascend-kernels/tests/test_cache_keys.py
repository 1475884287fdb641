"""Settled cache keys do not depend on the order a process computed them in.

Triton 3.6 merges a callee's ``tl.constexpr`` globals into its caller before computing the callee's
key, so a kernel's key depends on which kernels sharing its helpers came first (on an H100 with
Triton 3.6, 12 of 86 warm-up variants compiled ahead by worker processes landed under other keys
than the warm-up's launches looked up). The Triton installed here computes the callee's key first;
the scripts below put the 3.6 order back (``merge_before_key``) to show the dependence, then that
``kernel_module``'s settled keys are the same whatever the order. In fresh processes without
``TRITON_INTERPRET`` (the interpreter has no cache keys)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
from triton.runtime import jit

triton_update_hash = jit.DependenciesFinder._update_hash

def merge_before_key(self, func):
    if not isinstance(func, jit.JITFunction):  # what older finders also pass here
        return triton_update_hash(self, func)
    self.used_global_vals.update(func.used_global_vals)  # empty while func's key is not computed yet
    self.hasher.update((func.cache_key + str(getattr(func, "noinline", False))).encode("utf-8"))

jit.DependenciesFinder._update_hash = merge_before_key
from vllm_ascend.kernels._backend import kernel_module
from vllm_ascend.kernels._cache_keys import callees
from vllm_ascend.kernels._triton import logprobs, rejection, top_k_top_p

kernels = {"threshold": top_k_top_p._threshold_kernel, "topk_logprobs": logprobs._topk_logprobs_kernel}
raw = {name: kernels[name].cache_key for name in sys.argv[1].split(",")}
kernel_module("top_k_top_p"), kernel_module("logprobs")
settled = {name: fn.cache_key for name, fn in kernels.items()}
closed = all(
    set(callee.used_global_vals) <= set(fn.used_global_vals)
    for fn in kernels.values()
    for callee in callees(fn, jit.JITFunction)
)
random_callees = sorted(fn.fn.__name__ for fn in callees(rejection._random_kernel, jit.JITFunction))
print(json.dumps({"raw": raw, "settled": settled, "closed": closed, "random_callees": random_callees}))
"""


def _keys(order: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, order],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_settled_keys_do_not_depend_on_the_order_they_were_computed_in():
    first, second = _keys("threshold,topk_logprobs"), _keys("topk_logprobs,threshold")
    assert first["raw"] != second["raw"]  # the 3.6 order: one of the two kernels' key moved
    assert first["settled"] == second["settled"]
    assert first["closed"] and second["closed"]  # every callee's globals are in its caller's
    assert first["random_callees"] == ["_span", "_uniform", "_write_prefix"]  # what its body calls
