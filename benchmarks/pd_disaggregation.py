"""Prefill/decode disaggregation benchmarks, each side by side with a named peer in one run (127.0.0.1 only).

``transfer``: bytes/s of the connectors' KV path (``MooncakeEngine.read`` of block-sized ranges, batched as the
worker batches them) against Mooncake's own ``transfer_engine_bench`` over the same TCP transport, same block
size, batch, threads and duration; sides interleaved, best of the rounds.

``serving``: TTFT and output throughput of P/D (``MooncakeConnectorV1`` prefill + decode instances behind
``vllm-ascend pd-proxy``) against one plain instance of the same tiny model on the same machine; streaming
requests at a fixed concurrency; sides interleaved, best of the rounds.

    uv run --no-sync python benchmarks/pd_disaggregation.py transfer [--seconds 3] [--rounds 3]
    uv run --no-sync python benchmarks/pd_disaggregation.py serving [--requests 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SCRIPT = r"""
import sys, time, torch
from vllm_ascend.kvtransfer.engine import MooncakeEngine
buffer = torch.ones(int(sys.argv[1]), dtype=torch.uint8)
engine = MooncakeEngine("127.0.0.1", "tcp")
engine.register(buffer.data_ptr(), buffer.numel())
print(engine.session_id, buffer.data_ptr(), flush=True)
time.sleep(3600)
"""


def _bench_binary() -> Path:
    import mooncake

    return Path(mooncake.__file__).parent / "transfer_engine_bench"


def _ours(seconds: float, block: int, batch: int, threads: int, buffer: int) -> float:
    """GB/s of MooncakeEngine.read from a target process's registered buffer."""
    import torch

    from vllm_ascend.kvtransfer.engine import MooncakeEngine, Transfer

    target = subprocess.Popen(
        [sys.executable, "-c", TARGET_SCRIPT, str(buffer)], stdout=subprocess.PIPE, text=True
    )
    try:
        session, remote_base = target.stdout.readline().split()  # type: ignore[union-attr]
        engine = MooncakeEngine("127.0.0.1", "tcp")
        local = torch.empty(buffer, dtype=torch.uint8)
        engine.register(local.data_ptr(), local.numel())
        slots = buffer // block
        moved = [0] * threads
        stop = time.monotonic() + seconds

        def worker(index: int) -> None:
            step = 0
            while time.monotonic() < stop:
                offsets = [((step * batch + i) * 7919 + index) % slots * block for i in range(batch)]
                engine.read(
                    session,
                    Transfer(
                        [local.data_ptr() + o for o in offsets],
                        [int(remote_base) + o for o in offsets],
                        [block] * batch,
                    ),
                )
                moved[index] += block * batch
                step += 1

        started = time.monotonic()
        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return sum(moved) / (time.monotonic() - started) / 1e9
    finally:
        target.kill()
        target.wait()


def _peer(seconds: float, block: int, batch: int, threads: int, buffer: int) -> float:
    """GB/s reported by Mooncake's transfer_engine_bench (target and initiator on 127.0.0.1)."""
    binary = str(_bench_binary())
    common = ["-protocol", "tcp", "-metadata_server", "P2PHANDSHAKE", "-buffer_size", str(buffer)]
    target = subprocess.Popen(
        [binary, "-mode", "target", "-local_server_name", "127.0.0.1:0", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        session = None
        deadline = time.monotonic() + 30
        while session is None and time.monotonic() < deadline:
            line = target.stdout.readline()  # type: ignore[union-attr]
            found = re.search(r"P2P handshake, listening on (\S+)", line)
            session = found.group(1) if found else None
        if session is None:
            raise RuntimeError("transfer_engine_bench target did not report its address")
        out = subprocess.run(
            [binary, "-mode", "initiator", "-local_server_name", "127.0.0.1:0", "-segment_id", session,
             "-operation", "read", "-block_size", str(block), "-batch_size", str(batch),
             "-duration", str(int(seconds)), "-threads", str(threads), *common],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
        found = re.search(r"throughput ([0-9.]+) GB/s", out.stdout + out.stderr)
        if not found:
            raise RuntimeError(f"transfer_engine_bench printed no throughput:\n{out.stderr[-2000:]}")
        return float(found.group(1))
    finally:
        target.kill()
        target.wait()


def transfer(args: argparse.Namespace) -> None:
    buffer = max(args.block * args.batch * 4, 100 << 20)
    best = {"ours": 0.0, "peer": 0.0}
    for round_ in range(args.rounds):
        for side, fn in (
            (("ours", _ours), ("peer", _peer)) if round_ % 2 == 0 else (("peer", _peer), ("ours", _ours))
        ):
            rate = fn(args.seconds, args.block, args.batch, args.threads, buffer)
            best[side] = max(best[side], rate)
            print(f"round {round_ + 1} {side:5s} {rate:.3f} GB/s", flush=True)
    print(
        f"\n| side | GB/s (best of {args.rounds}) |\n|---|---|\n"
        f"| vllm-ascend kvtransfer (MooncakeEngine.read) | {best['ours']:.3f} |\n"
        f"| Mooncake transfer_engine_bench | {best['peer']:.3f} |\n"
        f"ratio ours/peer: {best['ours'] / best['peer']:.2f} (block {args.block} B, batch {args.batch}, "
        f"{args.threads} threads, {args.seconds:g} s per side)"
    )


def _pd_helpers():
    spec = importlib.util.spec_from_file_location("pd_helpers", ROOT / "tests/e2e/pd.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _stream(base: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """(seconds to the first SSE chunk, output tokens) of one streamed completion."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    req = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start, first, chunks = time.monotonic(), None, 0
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                first = first if first is not None else time.monotonic() - start
                chunks += 1
    return first or 0.0, chunks


def _load(base: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[float, float]:
    """(median TTFT ms, output tokens/s) of all prompts at ``concurrency``."""
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: _stream(base, p, max_tokens), prompts))
    elapsed = time.monotonic() - started
    ttfts = sorted(r[0] for r in results)
    return ttfts[len(ttfts) // 2] * 1e3, sum(r[1] for r in results) / elapsed


def serving(args: argparse.Namespace) -> None:
    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    pd = _pd_helpers()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(qwen3_spec(), work / "models")
    prompts = [[(13 * i + 7 * r) % 500 + 3 for i in range(64 + (r * 37) % 129)] for r in range(args.requests)]

    def connector(role: str) -> dict:
        return {"kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": pd.free_port_block(4)}

    single = pd.start_serve(model, work / "single.log", args=["--no-enable-prefix-caching"])
    prefill = pd.start_serve(model, work / "prefill.log", kv_transfer=connector("kv_producer"),
                             args=["--no-enable-prefix-caching"])  # fmt: skip
    decode = pd.start_serve(model, work / "decode.log", kv_transfer=connector("kv_consumer"),
                            args=["--no-enable-prefix-caching"])  # fmt: skip
    with pd.running(single, prefill, decode):
        proxy = pd.start_proxy([prefill], [decode], work / "proxy.log")
        with pd.running(proxy):
            _load(single.base, prompts[:4], args.max_tokens, 2)  # warm both paths
            _load(proxy.base, prompts[:4], args.max_tokens, 2)
            best = {"one instance": (1e18, 0.0), "P/D (pd-proxy)": (1e18, 0.0)}
            sides = (("one instance", single.base), ("P/D (pd-proxy)", proxy.base))
            for round_ in range(args.rounds):
                for name, base in sides if round_ % 2 == 0 else sides[::-1]:
                    ttft, tput = _load(base, prompts, args.max_tokens, args.concurrency)
                    best[name] = (min(best[name][0], ttft), max(best[name][1], tput))
                    print(
                        f"round {round_ + 1} {name:16s} TTFT p50 {ttft:8.1f} ms  {tput:8.1f} tok/s",
                        flush=True,
                    )
    print(
        f"\n| side | TTFT p50 ms (best of {args.rounds}) | output tok/s (best of {args.rounds}) |\n|---|---|---|"
    )
    for name, (ttft, tput) in best.items():
        print(f"| {name} | {ttft:.1f} | {tput:.1f} |")
    print(
        f"{args.requests} requests, prompts 64-192 tokens, {args.max_tokens} output tokens, concurrency "
        f"{args.concurrency}, tiny Qwen3 on the reference device, {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    t = sub.add_parser("transfer")
    t.add_argument("--seconds", type=float, default=3.0)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--block", type=int, default=64 << 10)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("serving")
    s.add_argument("--requests", type=int, default=32)
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--concurrency", type=int, default=4)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--workdir", default="/tmp/pd-bench")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
    (transfer if args.part == "transfer" else serving)(args)


if __name__ == "__main__":
    main()
