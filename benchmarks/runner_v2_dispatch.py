"""Host cost of a Model Runner V2 kernel override, launch excluded, side by side with vLLM's launch path.

    TRITON_INTERPRET=1 python benchmarks/runner_v2_dispatch.py [--dir .peer/vllm_032_v2] [--calls 2000]

Every case of ``benchmarks/runner_v2_kernels.py`` (its ``--smoke`` shapes, CPU tensors) is called with
the kernel launch itself stubbed out (Triton's interpreted ``run`` returns at once), so what is timed
is the Python between the caller and the launch: vLLM's ``kernel[grid](**args)`` against our
``override(grid, **args)`` (backend choice, geometry, tile math, then ``kernel[grid](...)``): the best
per-call time of 5 rounds, and the function calls (Python and C) one call makes, which a busy machine
does not change. Host timing of this machine's CPU: read the differences, not the absolute numbers.
``VLLM_ASCEND_DEVICE`` is left as the caller set it (unset: ``auto``, as on a CUDA benchmark machine).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import runner_v2_kernels as v2bench  # noqa: E402


def _per_call_us(fn, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def _function_calls(fn) -> int:
    fn()
    count = 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count - 1  # setprofile(None) itself


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default=str(v2bench.DEFAULT_DIR))
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    from triton.runtime import interpreter

    vllm = v2bench.VllmKernels(Path(args.dir))
    from vllm_ascend.kernels import v2 as ours_pkg

    overrides = ours_pkg.v2_kernel_overrides()
    interpreter.InterpretedFunction.run = lambda self, *a, **k: None  # the launch itself, stubbed out
    print("| kernel | vLLM launch path us | our override us | extra us | vLLM calls | our calls |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    totals = [0.0, 0.0, 0, 0]
    cases = v2bench.build_cases("cpu", smoke=True)
    for case in cases:
        module, name = case.name.rsplit(".", 1)
        kernel = vllm[module][name]
        override = overrides[v2bench.PREFIX + case.name]
        a = dict(case.args)

        def call_vllm(kernel=kernel, grid=case.grid, a=a, launch=case.launch) -> None:
            kernel[grid](**a, **launch)

        call_ours = functools.partial(override, case.grid, **a)
        theirs, ours = _per_call_us(call_vllm, args.calls), _per_call_us(call_ours, args.calls)
        their_calls, our_calls = _function_calls(call_vllm), _function_calls(call_ours)
        for i, value in enumerate((theirs, ours, their_calls, our_calls)):
            totals[i] += value
        print(
            f"| `{case.name}` | {theirs:.1f} | {ours:.1f} | {ours - theirs:+.1f} | {their_calls} | {our_calls} |"
        )
    n = len(cases)
    print(
        f"| mean | {totals[0] / n:.1f} | {totals[1] / n:.1f} | {(totals[1] - totals[0]) / n:+.1f} | "
        f"{totals[2] / n:.0f} | {totals[3] / n:.0f} |"
    )


if __name__ == "__main__":
    main()
