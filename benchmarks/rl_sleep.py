"""RL rollout memory operations on the reference device: sleep, wake-up and weight update seconds per GB.

One engine (``vllm.LLM``, Model Runner V2, ``enable_sleep_mode``) on a random-weight Qwen3 of about
``--layers`` × 16 M float32 parameters and a ``--kv-gib`` KV cache, every KV page made resident first (a serving
engine's are). Per round, timed around vLLM's own calls:

- ``sleep(1)``: the weights copied to the host, every pool region released (``madvise``); ``wake_up()``: the
  regions backed again at their addresses, the weights copied back;
- ``sleep(2)``: released without a copy; ``wake_up(["weights"])`` + ``reload_weights`` (from the checkpoint on
  disk) and ``wake_up(["kv_cache"])``;
- weight updates from a trainer process (``vllm_ascend.testing.weight_sync``, an HF model of the same checkpoint):
  the whole state dict broadcast over gloo on 127.0.0.1 in 64 MiB packed chunks and loaded in place
  (``weight_transfer_config={"backend": "gloo"}``), timed from ``start_weight_update`` to the end of
  ``finish_weight_update`` on the inference side.

Beside them, in the same run, the ceilings of the host: one ``memcpy`` of the same bytes (``Tensor.copy_``) and
one ``madvise(MADV_DONTNEED)`` of them. Seconds per GB = seconds / (bytes moved / 1e9), best of ``--rounds``.
The process's resident set is read before and after each sleep. Run:
``uv run --no-sync python benchmarks/rl_sleep.py [--layers 12] [--kv-gib 1] [--write benchmarks/RESULTS-rl.md]``.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import time
from pathlib import Path

import psutil
import torch
from _report import host_line, write_measured_table


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _ceilings(nbytes: int) -> dict[str, float]:
    """memcpy and madvise of ``nbytes`` on this host (the floor of any offload / release)."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(2)
    memcpy = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = torch.frombuffer(mapping, dtype=torch.uint8)
    release = []
    for _ in range(3):
        view.fill_(3)
        release.append(_timed(lambda: mapping.madvise(mmap.MADV_DONTNEED)))
    del view
    return {"memcpy": memcpy, "madvise": min(release)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path, help="put the table into this RESULTS file")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from vllm import LLM, SamplingParams

    from vllm_ascend.core.sdk import get_device_adaptor
    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec
    from vllm_ascend.testing.weight_sync import llm_handlers, run_trainer

    spec = qwen3_spec(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_layers=args.layers, num_heads=16,
        num_kv_heads=8, head_dim=64,
    )  # fmt: skip
    model_dir = build_tiny_model(spec)
    llm = LLM(
        model=str(model_dir), dtype="float32", max_model_len=256, kv_cache_memory_bytes=int(args.kv_gib * 2**30),
        seed=0, enable_sleep_mode=True, weight_transfer_config={"backend": "gloo"},
    )  # fmt: skip
    worker = llm.collective_rpc(lambda wrapper: wrapper.worker)[0]
    pool = get_device_adaptor().memory_pool()
    weights, kv = pool.allocated_bytes("weights"), pool.allocated_bytes("kv_cache")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = [{"prompt_token_ids": [1, 2, 3, 4]}]

    def updates(rounds: int) -> list[float]:
        """``rounds`` updates from one trainer process (its HF model: the same checkpoint), each timed from
        ``start_weight_update`` to the end of ``finish_weight_update`` on the inference side."""
        handlers, times, started = llm_handlers(llm), [], []

        def start() -> None:
            started.append(time.perf_counter())
            handlers_start()

        def finish() -> None:
            handlers_finish()
            times.append(time.perf_counter() - started[-1])

        handlers_start, handlers_finish = handlers["start_weight_update"], handlers["finish_weight_update"]
        handlers.update(start_weight_update=start, finish_weight_update=finish)
        spec = {"backend": "gloo", "world_size": 2, "model": str(model_dir), "rounds": rounds,
                "packed_buffer_size_bytes": 64 << 20}  # fmt: skip
        run_trainer(spec, handlers, timeout_s=600)
        return times

    def touch() -> None:
        for cache in worker.model_runner.kv_caches:
            if isinstance(cache, torch.Tensor):
                cache.zero_()

    rows: dict[str, list[float]] = {}
    rss_drop: dict[str, int] = {}
    for _ in range(args.rounds):
        llm.generate(prompt, params, use_tqdm=False)
        touch()
        before = _rss()
        rows.setdefault("sleep(1)", []).append(_timed(lambda: llm.sleep(level=1)))
        rss_drop["sleep(1)"] = before - _rss()
        rows.setdefault("wake_up()", []).append(_timed(llm.wake_up))
        touch()
        before = _rss()
        rows.setdefault("sleep(2)", []).append(_timed(lambda: llm.sleep(level=2)))
        rss_drop["sleep(2)"] = before - _rss()
        rows.setdefault('wake_up(["weights"]) + reload_weights', []).append(
            _timed(lambda: (llm.wake_up(tags=["weights"]), llm.collective_rpc("reload_weights")))
        )
        rows.setdefault('wake_up(["kv_cache"])', []).append(_timed(lambda: llm.wake_up(tags=["kv_cache"])))
    rows["weight update from a trainer (gloo)"] = updates(args.rounds)
    ceilings = _ceilings(weights + kv)
    llm.llm_engine.engine_core.shutdown()

    moved = {
        "sleep(1)": weights + kv,
        "wake_up()": weights + kv,
        "sleep(2)": weights + kv,
        'wake_up(["weights"]) + reload_weights': weights,
        'wake_up(["kv_cache"])': kv,
        "weight update from a trainer (gloo)": weights,
    }
    lines = [
        f"Host: {host_line()}. Model: random Qwen3 fp32, hidden {args.hidden}, {args.layers} layers: "
        f"{weights / 1e9:.3f} GB of weights in the pool, KV cache {kv / 1e9:.3f} GB; best of {args.rounds} rounds.",
        "",
        "| operation | bytes (GB) | seconds | s/GB | process RSS released (GB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, times in rows.items():
        best, gb = min(times), moved[name] / 1e9
        drop = f"{rss_drop[name] / 1e9:.3f}" if name in rss_drop else ""
        lines.append(f"| {name} | {gb:.3f} | {best:.3f} | {best / gb:.3f} | {drop} |")
    total = (weights + kv) / 1e9
    for name, seconds in ceilings.items():
        lines.append(
            f"| ceiling: one {name} of the same bytes | {total:.3f} | {seconds:.3f} | {seconds / total:.3f} | |"
        )
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_measured_table(args.write, table)


if __name__ == "__main__":
    main()
