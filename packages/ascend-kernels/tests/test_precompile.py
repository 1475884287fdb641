"""Ahead-of-time compilation for the warm-up, on a stand-in CUDA device (``fake_cuda``: Triton's real
launch path for an ``sm_90`` target of 132 SMs, compiles with the wheel's ``ptxas``, launches recorded
instead of run), in subprocesses without ``TRITON_INTERPRET``, which this package's conftest sets:
every variant a launch misses is queued under the cache key that launch looks up, and the key the
compile workers rebuild from it is the same; a variant reached only after a real launch is compiled
ahead by a later pass; the final pass compiles nothing; a warm cache takes one pass."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_ascend.kernels import _job_pool, _precompile, warmup

HERE = Path(__file__).parent


def _script(path: Path, body: str, cache: Path) -> dict:
    """Run ``body`` as a script file (no ``if __name__ == "__main__":`` guard) on the stand-in device
    with ``cache`` as Triton's cache; its last stdout line is JSON."""
    path.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport fake_cuda\n{body}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    proc = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


KEYS = r"""
import json, torch
from triton.compiler import make_backend
from vllm_ascend.kernels import _precompile, warmup
from vllm_ascend.kernels.ngram import ngram_warmup

items = {"sampling": warmup.sampling_warmup, "penalties": warmup.penalties_triton_warmup,
         "rejection": warmup.rejection_sampler_triton_warmup, "ngram": ngram_warmup,
         "qk_rms": lambda device, vocab, dtypes: warmup.triton_rms_warmup(device, 128, dtypes)}
with _precompile.guarded() as state:
    results = {name: warmup._run(name, fn, torch.device("cpu"), 32000, (torch.float32, torch.bfloat16))
               for name, fn in items.items()}
rebuilt = {}
for spec, looked_up in state.missing.items():
    name, source, target, options = _precompile._source(spec)  # what a compile worker compiles
    rebuilt[spec] = [name, looked_up, _precompile.cache_entry(source, make_backend(target), options)[0]]
small = next(spec for spec, (name, _, _) in rebuilt.items() if name.endswith("._expand_kernel"))
try:  # a variant that lands under another key than its launch looks up is refused
    _precompile.compile_job({"spec": small, "hash": "0" * 64})
    mismatch = None
except _precompile.KeyMismatchError as exc:
    mismatch = str(exc)
print(json.dumps({"results": results, "launches": fake_cuda.launches, "loaded": state.loaded,
                  "rebuilt": list(rebuilt.values()), "mismatch": mismatch}))
"""


def test_every_warm_up_variant_is_queued_under_the_key_its_launch_looks_up(tmp_path):
    """The first pass on an empty cache launches nothing and queues each variant with the on-disk key
    computed from the launch's own specialization; rebuilt from the serialized form, as the compile
    workers do, each has that key (so what they compile is what the launch loads)."""
    result = _script(tmp_path / "keys.py", KEYS, tmp_path / "cache")
    assert result["results"] == dict.fromkeys(("sampling", "penalties", "rejection", "ngram", "qk_rms"), True)
    assert result["launches"] == [] and result["loaded"] == 0
    rebuilt = result["rebuilt"]
    kernels = {name.rsplit(".", 1)[1] for name, _, _ in rebuilt}
    assert len(rebuilt) >= 80 and len(kernels) == 28, sorted(kernels)
    assert {"_threshold_kernel", "_chunk_mask_kernel", "_ngram_kernel", "_q_rms_kernel"} <= kernels
    # top-p alone: float32 logits fuse the bucket copy and the mask, 16-bit logits keep them apart
    assert {"_top_p_mask_collect_kernel", "_top_p_finish_kernel", "_top_p_bucket_kernel"} <= kernels
    assert {
        "_add_kernel",
        "_clear_kernel",
        "_apply_kernel",
    } <= kernels  # the kept penalty counts' three kernels
    assert [(name, looked_up) for name, looked_up, key in rebuilt if key != looked_up] == []
    assert "_expand_kernel: rebuilt from its serialized specialization it is cached as " in result["mismatch"]
    assert result["mismatch"].endswith("its launch looks up " + "0" * 64)


CHAIN = r"""
import json
import chain_kernel
from vllm_ascend.kernels import warmup

fake_cuda.EFFECTS["_fill_kernel"] = chain_kernel.fill
warmup.register_warmup("chain", chain_kernel.chain_warmup)
stats = {}
results = warmup.kernel_warmup("cpu", 32, include=("chain",), workers=2, stats=stats)
print(json.dumps({"results": results, "launches": fake_cuda.launches, "stats": stats}))
"""


def test_a_variant_reached_after_a_real_launch_is_compiled_ahead_and_a_warm_cache_takes_one_pass(tmp_path):
    """``chain_kernel``'s second launch needs a tile it learns from the first one's output. Cold: pass 1
    holds both launches back (the second with the tile an unset output gives), pass 2 launches the
    first for real and holds back the second, now with the tile it really needs, pass 3 launches
    both and compiles nothing. A new process on the filled cache: one pass, both loaded. The script
    has no ``__main__`` guard (the compile workers do not import it)."""
    cache = tmp_path / "cache"
    cold = _script(tmp_path / "chain.py", CHAIN, cache)
    stats = cold["stats"]
    assert cold["results"] == {"chain": True}
    assert stats["passes"] == 3 and stats["variants"] == 3 and stats["failed"] == 0
    assert stats["variants_by_kernel"] == {"chain_kernel._fill_kernel": 3}
    assert stats["compiled_at_launch"] == [] and stats["cached"] == 0
    assert cold["launches"] == ["_fill_kernel"] * 3  # pass 2's first launch, then pass 3's two
    warm = _script(tmp_path / "chain.py", CHAIN, cache)["stats"]
    assert (warm["passes"], warm["cached"], warm["variants"], warm["compiled_at_launch"]) == (1, 2, 0, [])
    assert warm["record_s"] == warm["compile_s"] == 0


def test_launchers_are_built_by_the_driver_of_the_target_s_backend():
    """Triton keys its backends by package (``nvidia``), targets name ``cuda``."""
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget

    assert _precompile._driver_class(GPUTarget("cuda", 90, 32)) is backends["nvidia"].driver


def test_precompile_is_off_where_nothing_compiles():
    """The interpreter (this suite) has nothing to compile ahead."""
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
    """The warning names the signal once and the kernels whose variants were lost."""
    import signal

    killed = _job_pool.Outcome(lost=True, exit=-signal.SIGABRT, detail="Fatal Python error: Aborted")
    plugin_logger = logging.getLogger("vllm_ascend")  # does not propagate to the root logger
    plugin_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING"):
            _precompile._report_dead_workers([("k2", killed), ("k1", killed), ("k2", killed)])
    finally:
        plugin_logger.removeHandler(caplog.handler)
    (message,) = [r.getMessage() for r in caplog.records if "ahead-of-time compile process" in r.getMessage()]
    assert f"was killed by SIGABRT ({signal.strsignal(signal.SIGABRT)})" in message
    assert "hint: a crash in native code" in message
    assert message.endswith(
        "3 variants (k1, k2) were not compiled ahead of time: their launches compile them"
    )
