"""Ahead-of-time compilation for the warm-up: a recorded specialization compiled in a worker process
lands in Triton's cache under the key the launch itself computes (the launch then only loads); a
broken one is skipped and reported. Compiles for an sm_90 target with upstream Triton's CUDA backend
(no GPU needed), in a subprocess without ``TRITON_INTERPRET``, which this package's conftest sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_ascend.kernels import _precompile, warmup

SCRIPT = r"""
import json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import get_full_name, serialize_specialization_data
from vllm_ascend.kernels import _precompile
from vllm_ascend.kernels._triton.temperature import _temperature_kernel as kernel

cache = os.environ["TRITON_CACHE_DIR"]
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
options = backend.parse_options({"num_warps": 8})
signature = {"logits_ptr": "*bf16", "row_stride": "i32", "temp_ptr": "*fp32", "vocab": "i32", "BLOCK": "constexpr"}
constants = {(4,): 4096}
attrs = {(i,): backend.parse_attr("D") for i in (0, 2, 3)}
spec = serialize_specialization_data(get_full_name(kernel.fn), signature, constants, attrs, options, "k", target)
broken = spec.replace("_temperature_kernel", "_no_such_kernel")

def files():
    return sorted(os.path.relpath(os.path.join(d, f), cache) for d, _, names in os.walk(cache) for f in names)

counts = _precompile.compile_specs([spec, broken], 2)
before = files()
triton.compile(ASTSource(kernel, signature, constants, attrs), target=target, options=options.__dict__)
print(json.dumps({"counts": counts, "before": before, "after": files()}))
"""


def test_a_spec_compiled_in_a_worker_is_the_launch_s_cache_entry(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["counts"] == {"vllm_ascend.kernels._triton.temperature._temperature_kernel": 1}
    assert any(name.endswith("_temperature_kernel.cubin") for name in result["before"]), result["before"]
    # the in-process compile of the same source (what the launch runs) found it: a miss adds a directory
    assert result["after"] == result["before"]


def test_precompile_is_off_where_nothing_compiles():
    """The interpreter (this suite) and the torch references have nothing to compile ahead."""
    assert _precompile.supported()
    assert warmup._parallel(torch.device("cpu"), None) == 0
    assert warmup._parallel(torch.device("cpu"), 8) == 0


@pytest.mark.parametrize("workers", [0, -2, 1.5, "4"])
def test_workers_must_be_a_positive_int(workers):
    with pytest.raises(ValueError, match=rf"workers={workers!r} must be a positive int or None"):
        warmup.kernel_warmup("cpu", 32, include=("penalties",), workers=workers)


def test_stats_report_the_launch_phase():
    stats: dict = {}
    assert warmup.kernel_warmup("cpu", 32, include=("penalties",), workers=4, stats=stats) == {
        "penalties": True
    }
    assert stats["workers"] == 1 and stats["launch_s"] >= 0 and "variants" not in stats


def test_a_compile_process_killed_by_a_signal_is_reported_by_name(caplog):
    """A dead compile process breaks the pool; the warning names the signal, once, and the kernels left over."""
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(os.abort)
        processes = dict(pool._processes)  # what compile_specs keeps after submitting
        with pytest.raises(BrokenProcessPool):
            future.result(timeout=120)
        with caplog.at_level("WARNING"):
            _precompile._report_dead_workers(processes, ["k2", "k1", "k2"])
    (message,) = [r.getMessage() for r in caplog.records if "ahead-of-time compile process" in r.getMessage()]
    assert f"was killed by SIGABRT ({signal.strsignal(signal.SIGABRT)})" in message
    assert "hint: a crash in native code" in message
    assert message.endswith(
        "3 specializations (k1, k2) were not compiled ahead of time: the warm-up compiles them"
    )
