"""Prefill/decode disaggregation benchmarks, each side by side with a named peer in one run (127.0.0.1 only).

``transfer``: bytes/s of the connectors' KV path against Mooncake's own ``transfer_engine_bench`` over the
same TCP transport. Ours: a target process holds a KV cache (``[K/V, blocks, 16 tokens, heads, 128]`` bf16,
one view of one registered ``--buffer-mib`` buffer per block size) and sends its layout (``describe_cache``,
as the side channel does); this process plans each batch with ``plan_copies`` (``--batch`` ranges: half as many
blocks, K and V) and reads it with ``MooncakeEngine.read`` from ``--threads`` threads, as the worker's transfer
threads do. Peer: ``transfer_engine_bench`` target + initiator (P2PHANDSHAKE, ``-operation read``) with the
same block size, batch size, threads, buffer and duration. Both targets live for the whole run; per block
size the sides alternate (which one goes first alternates by round); each cell is the best of ``--rounds``.

``serving``: TTFT and output throughput of P/D (``MooncakeConnectorV1`` prefill + decode instances behind
``vllm-ascend pd-proxy``) against one plain instance of the same tiny Qwen3 on the same machine: the same
streamed requests at a fixed concurrency, TTFT = time to the first SSE chunk, output tok/s = completion tokens
(from the streamed usage) / wall time of the whole set; sides interleaved, best of the rounds. Decode's
``vllm:external_prefix_cache_hits_total`` is read around each P/D round to show the prompts' KV was pulled.

    uv run --no-sync python benchmarks/pd_disaggregation.py transfer [--seconds 3] [--rounds 3] [--write F]
    uv run --no-sync python benchmarks/pd_disaggregation.py serving [--requests 32] [--rounds 3] [--write F]

``--write benchmarks/RESULTS-pd.md`` puts the part's table between that part's markers in the file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _report import host_line, write_part_table

ROOT = Path(__file__).resolve().parents[1]
TOKENS_PER_BLOCK, HEAD_DIM, ELEMENT = 16, 128, 2  # bf16 cache, vLLM's [2, blocks, 16, heads, head_dim]

#: The target of our side: one registered buffer, viewed as a KV cache per block size; prints
#: ``{"session", "layouts": {block: LayerLayout}}`` and waits to be killed.
TARGET_SCRIPT = r"""
import json, sys, time, msgspec, torch
from vllm_ascend.kvtransfer.engine import MooncakeEngine
from vllm_ascend.kvtransfer.layout import describe_cache
nbytes, blocks = int(sys.argv[1]), [int(b) for b in sys.argv[2].split(",")]
buffer = (torch.arange(nbytes, dtype=torch.int64) % 251).to(torch.uint8)
engine = MooncakeEngine("127.0.0.1", "tcp")
engine.register(buffer.data_ptr(), buffer.numel())
layouts = {}
for block in blocks:
    heads, num_blocks = block // (16 * 128 * 2), nbytes // (2 * block)
    cache = buffer[: 2 * num_blocks * block].view(torch.bfloat16).view(2, num_blocks, 16, heads, 128)
    layout = describe_cache("layers.0.attn", cache, num_blocks, block_size=16, num_heads=heads, replicated=False)
    layouts[block] = json.loads(msgspec.json.encode(layout))
print(json.dumps({"session": engine.session_id, "layouts": layouts}), flush=True)
time.sleep(3600)
"""


# -- transfer ------------------------------------------------------------------------------------------
def _bench_binary() -> Path:
    import mooncake

    return Path(mooncake.__file__).parent / "transfer_engine_bench"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def _readline(proc: subprocess.Popen, pattern: str, timeout: float) -> re.Match:
    """The first line of ``proc``'s stdout matching ``pattern`` (read on a thread, so a hung child times out)."""
    found: list[re.Match] = []

    def scan() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            match = re.search(pattern, line)
            if match:
                found.append(match)
                return

    reader = threading.Thread(target=scan, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        raise RuntimeError(f"{proc.args[:2]} printed no line matching {pattern!r} in {timeout:g}s")
    return found[0]


class Ours:
    """The initiator side of our KV path: a local buffer, its cache views, and the target's layouts."""

    def __init__(self, buffer: int, blocks: list[int]) -> None:
        import msgspec
        import torch

        from vllm_ascend.kvtransfer.engine import MooncakeEngine
        from vllm_ascend.kvtransfer.layout import LayerLayout, RankView, describe_cache

        self.target = subprocess.Popen(
            [sys.executable, "-c", TARGET_SCRIPT, str(buffer), ",".join(map(str, blocks))],
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(_readline(self.target, r"^\{.*\}$", 120).group(0))
        self.session = hello["session"]
        self.engine = MooncakeEngine("127.0.0.1", "tcp")
        self.local = torch.zeros(buffer, dtype=torch.uint8)
        self.engine.register(self.local.data_ptr(), self.local.numel())
        self.views: dict[int, tuple[Any, Any, int]] = {}
        for block in blocks:
            heads, num_blocks = block // (TOKENS_PER_BLOCK * HEAD_DIM * ELEMENT), buffer // (2 * block)
            cache = self.local[: 2 * num_blocks * block].view(torch.bfloat16)
            cache = cache.view(2, num_blocks, TOKENS_PER_BLOCK, heads, HEAD_DIM)
            here = describe_cache(
                "layers.0.attn",
                cache,
                num_blocks,
                block_size=TOKENS_PER_BLOCK,
                num_heads=heads,
                replicated=False,
            )
            there = msgspec.convert(hello["layouts"][str(block)], LayerLayout)
            self.views[block] = (RankView([here], 0, 1), RankView([there], 0, 1), num_blocks)

    def check(self, block: int) -> None:
        """Read one batch and compare it with the target's byte pattern (position % 251)."""
        import torch

        from vllm_ascend.kvtransfer.engine import Transfer
        from vllm_ascend.kvtransfer.layout import plan_copies

        here, there, _ = self.views[block]
        ids = list(range(0, 16, 2))
        local, remote, lengths = plan_copies(here, there, ids, ids[::-1])
        self.engine.read(self.session, Transfer(local, remote, lengths))
        base_here, base_there = here.layers[0].regions[0].base, there.layers[0].regions[0].base
        for h, t, n in zip(local, remote, lengths, strict=True):
            got = self.local[h - base_here : h - base_here + n]
            want = (torch.arange(t - base_there, t - base_there + n) % 251).to(torch.uint8)
            if not torch.equal(got, want):
                raise RuntimeError(f"block {block}: read bytes differ from the target's")

    def run(self, seconds: float, block: int, batch: int, threads: int) -> float:
        """GB/s (1e9 B/s) of ``threads`` threads each planning and reading ``batch``-range batches."""
        from vllm_ascend.kvtransfer.engine import Transfer
        from vllm_ascend.kvtransfer.layout import plan_copies

        here, there, num_blocks = self.views[block]
        per_batch = batch // 2  # K and V: two ranges per block
        # even block ids only, never the last block: no two planned ranges are adjacent, so none merge
        usable = list(range(0, num_blocks - 1, 2))
        moved = [0] * threads
        stop = time.monotonic() + seconds

        def worker(index: int) -> None:
            step = index * 7919
            while time.monotonic() < stop:
                remote = [usable[(step + i) % len(usable)] for i in range(per_batch)]
                local = [usable[(step * 3 + i * 5) % len(usable)] for i in range(per_batch)]
                h, t, n = plan_copies(here, there, local, remote)
                if len(n) != 2 * per_batch:
                    raise RuntimeError(f"planned {len(n)} ranges, wanted {2 * per_batch}")
                self.engine.read(self.session, Transfer(h, t, n))
                moved[index] += sum(n)
                step += per_batch

        started = time.monotonic()
        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        return sum(moved) / (time.monotonic() - started) / 1e9

    def close(self) -> None:
        self.engine.close()
        _stop(self.target)


class Peer:
    """Mooncake's ``transfer_engine_bench``: one target for the run, one initiator per measurement."""

    def __init__(self, buffer: int) -> None:
        self.binary = str(_bench_binary())
        self.common = ["-protocol", "tcp", "-metadata_server", "P2PHANDSHAKE", "-buffer_size", str(buffer)]
        self.target = subprocess.Popen(
            [self.binary, "-mode", "target", "-local_server_name", "127.0.0.1:0", *self.common],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # P2PHANDSHAKE: the target is addressed by its RPC host:port, which it logs at start
        self.segment = _readline(self.target, r"P2P handshake, listening on (\S+)", 60).group(1)

    def run(self, seconds: float, block: int, batch: int, threads: int) -> float:
        out = subprocess.run(
            [self.binary, "-mode", "initiator", "-local_server_name", "127.0.0.1:0", "-segment_id", self.segment,
             "-operation", "read", "-block_size", str(block), "-batch_size", str(batch),
             "-duration", str(int(seconds)), "-threads", str(threads), "-report_unit", "GB",
             "-report_precision", "4", *self.common],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
        found = re.search(r"throughput ([0-9.]+) GB/s", out.stdout + out.stderr)
        if not found:
            raise RuntimeError(f"transfer_engine_bench printed no throughput:\n{out.stderr[-2000:]}")
        return float(found.group(1))

    def close(self) -> None:
        _stop(self.target)


def transfer(args: argparse.Namespace) -> str:
    blocks = [int(b) << 10 for b in args.block_kib]
    for block in blocks:
        if block % (TOKENS_PER_BLOCK * HEAD_DIM * ELEMENT):
            raise SystemExit(f"block sizes must be multiples of 4 KiB (16 tokens x 128 x bf16), got {block}")
    if args.batch % 2:
        raise SystemExit("--batch must be even (K and V ranges)")
    if int(args.seconds) != args.seconds:
        raise SystemExit("--seconds must be whole (transfer_engine_bench takes whole seconds)")
    buffer = args.buffer_mib << 20
    ours = peer = None
    best: dict[tuple[int, str], float] = {}
    try:
        ours, peer = Ours(buffer, blocks), Peer(buffer)
        for block in blocks:
            ours.check(block)
        for round_ in range(args.rounds):
            for block in blocks:
                sides = [("ours", ours), ("peer", peer)]
                for side, runner in sides if round_ % 2 == 0 else sides[::-1]:
                    rate = runner.run(args.seconds, block, args.batch, args.threads)
                    best[block, side] = max(best.get((block, side), 0.0), rate)
                    print(
                        f"round {round_ + 1} block {block >> 10:4d} KiB {side:5s} {rate:.3f} GB/s", flush=True
                    )
    finally:
        for side in (ours, peer):
            if side is not None:
                side.close()
    lines = [
        f"127.0.0.1, TCP, `-operation read`, batch {args.batch} ranges, {args.threads} threads, "
        f"{args.seconds:g} s per measurement, {args.buffer_mib} MiB buffer, best of {args.rounds}; {host_line()}",
        "",
        "| block | vllm-ascend kvtransfer (`plan_copies` + `MooncakeEngine.read`) GB/s "
        "| Mooncake `transfer_engine_bench` GB/s | ours / peer |",
        "|---:|---:|---:|---:|",
    ]
    for block in blocks:
        o, p = best[block, "ours"], best[block, "peer"]
        lines.append(f"| {block >> 10} KiB | {o:.3f} | {p:.3f} | {o / p:.2f} |")
    return "\n".join(lines)


# -- serving -------------------------------------------------------------------------------------------
def _pd_helpers() -> Any:
    """tests/e2e/pd.py (start_serve / start_proxy / running), loaded by path so this script runs alone."""
    spec = importlib.util.spec_from_file_location("pd_bench_helpers", ROOT / "tests/e2e/pd.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _stream(base: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """(seconds to the first SSE chunk, completion tokens) of one streamed completion."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    req = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start, first, tokens = time.monotonic(), None, 0
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first if first is not None else time.monotonic() - start
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens = usage["completion_tokens"]
    if first is None or tokens != max_tokens:
        raise RuntimeError(f"{base}: stream gave first chunk {first}, {tokens} of {max_tokens} tokens")
    return first, tokens


def _load(
    base: str, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> tuple[float, float, float]:
    """(median TTFT ms, p90 TTFT ms, output tokens/s) of all prompts at ``concurrency``."""
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: _stream(base, p, max_tokens), prompts))
    elapsed = time.monotonic() - started
    ttfts = sorted(r[0] for r in results)
    p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
    return ttfts[len(ttfts) // 2] * 1e3, p90 * 1e3, sum(r[1] for r in results) / elapsed


def serving(args: argparse.Namespace) -> str:
    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    pd = _pd_helpers()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec = qwen3_spec(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers,
        num_heads=args.hidden // 32, num_kv_heads=max(1, args.hidden // 64),
    )  # fmt: skip
    model = build_tiny_model(spec, work / "models")
    prompts = [[(13 * i + 7 * r) % 500 + 3 for i in range(64 + (r * 37) % 129)] for r in range(args.requests)]
    hits = "vllm:external_prefix_cache_hits_total"

    def connector(role: str) -> dict[str, Any]:
        return {"kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": pd.free_port_block(4)}

    common = ["--no-enable-prefix-caching"]  # every round computes (P) or pulls (D) every prompt again
    started = time.monotonic()
    single = pd.start_serve(model, work / "single.log", args=common)
    prefill = pd.start_serve(model, work / "prefill.log", kv_transfer=connector("kv_producer"), args=common)
    decode = pd.start_serve(model, work / "decode.log", kv_transfer=connector("kv_consumer"), args=common)
    sides = (("one instance", single.base), ("P/D (pd-proxy)", None))
    best: dict[str, tuple[float, float, float]] = {}
    pulled: list[str] = []
    with pd.running(single, prefill, decode):
        proxy = pd.start_proxy([prefill], [decode], work / "proxy.log")
        with pd.running(proxy):
            print(f"4 instances healthy in {time.monotonic() - started:.0f} s", flush=True)
            urls = {"one instance": single.base, "P/D (pd-proxy)": proxy.base}
            for url in urls.values():  # warm both paths (first requests, Mooncake connections)
                _load(url, prompts[:4], args.max_tokens, 2)
            for round_ in range(args.rounds):
                for name, _ in sides if round_ % 2 == 0 else sides[::-1]:
                    before = pd.metric(decode.base, hits) if name.startswith("P/D") else 0.0
                    ttft, p90, tput = _load(urls[name], prompts, args.max_tokens, args.concurrency)
                    if name.startswith("P/D"):
                        pulled.append(f"{pd.metric(decode.base, hits) - before:.0f}")
                    old = best.get(name, (1e18, 1e18, 0.0))
                    best[name] = (min(old[0], ttft), min(old[1], p90), max(old[2], tput))
                    print(
                        f"round {round_ + 1} {name:15s} TTFT p50 {ttft:7.1f} ms p90 {p90:7.1f} ms "
                        f"{tput:7.1f} output tok/s",
                        flush=True,
                    )
    prompt_tokens = sum(len(p) for p in prompts)
    lines = [
        f"{args.requests} streamed requests, prompts 64-192 tokens ({prompt_tokens} in all), {args.max_tokens} "
        f"output tokens each, concurrency {args.concurrency}, best of {args.rounds}; tiny Qwen3 (hidden "
        f"{spec.hidden_size}, {spec.num_layers} layers, {spec.num_kv_heads} KV heads, fp32) on the reference "
        f"device, prefix caching off; decode pulled {' / '.join(pulled)} prompt tokens per P/D round "
        f"(`{hits}`); {host_line()}",
        "",
        "| side | TTFT p50 ms | TTFT p90 ms | output tok/s |",
        "|---|---:|---:|---:|",
    ]
    for name, (ttft, p90, tput) in best.items():
        lines.append(f"| {name} | {ttft:.1f} | {p90:.1f} | {tput:.1f} |")
    o, p = best["one instance"], best["P/D (pd-proxy)"]
    lines.append(f"| P/D / one instance | {p[0] / o[0]:.2f} | {p[1] / o[1]:.2f} | {p[2] / o[2]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    t = sub.add_parser("transfer", help="KV bytes/s: ours vs transfer_engine_bench")
    t.add_argument("--block-kib", type=int, nargs="+", default=[16, 64, 256])
    t.add_argument("--batch", type=int, default=32, help="ranges per batch (our side: half as many blocks)")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--seconds", type=float, default=3.0)
    t.add_argument("--buffer-mib", type=int, default=256)
    t.add_argument("--rounds", type=int, default=3)
    s = sub.add_parser("serving", help="TTFT and output tok/s: P/D behind pd-proxy vs one instance")
    s.add_argument("--requests", type=int, default=32)
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--concurrency", type=int, default=4)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--hidden", type=int, default=128, help="tiny Qwen3 hidden size (heads of 32)")
    s.add_argument("--layers", type=int, default=2)
    s.add_argument("--workdir", default="/tmp/pd-bench")
    for p in (t, s):
        p.add_argument("--write", type=Path, help="put the table into this RESULTS file")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks that stop the children
    table = (transfer if args.part == "transfer" else serving)(args)
    print(f"\n{table}")
    if args.write:
        write_part_table(args.write, args.part, table)


if __name__ == "__main__":
    main()
