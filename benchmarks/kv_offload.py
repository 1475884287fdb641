"""KV offload to host memory and the shared KV pool, each part side by side with a named peer in one run.

``copy``: bytes/s of the device adaptor's ``swap_blocks`` (the op ``NPUOffloadingWorker`` moves blocks with)
copying N blocks between a "device" KV tensor and a host tensor, both int8 ``[rows, page]`` views as the
worker hands them over, against a plain ``dst.copy_(src)`` of the same number of bytes between contiguous
tensors (the peer: what moving those bytes costs at least). Block ids are random (distinct rows drawn from the
whole tensor) or consecutive; store = device -> host, load = host -> device. Every case's copied rows are
checked byte for byte (and the untouched rows for zeros) before timing; per case the sides alternate (which
one goes first alternates by round), each timing repeats the copy for ``--seconds``, each cell is the best of
``--rounds``. Torch runs ``--threads`` intra-op threads (1: what vLLM's CPU worker leaves itself).

``replay``: a deterministic multi-turn chat trace (``--conversations`` x ``--turns``; turn 1 is a 300-420
token random prompt, every later turn's prompt is the previous prompt + that turn's greedy reply + 40-80 new
user tokens, so prefixes reach ~600 tokens) replayed one request at a time against a tiny Qwen3 whose device
KV cache holds ``--device-kv-tokens`` tokens: every turn of all conversations runs before the next turn, so
the device prefix cache has evicted a conversation's prefix before its next turn comes. Sides: ``none``
(device prefix cache only), ``offload`` (vLLM's ``OffloadingConnector`` with ``cpu_bytes_to_use``, served by
the platform's ``NPUOffloadingSpec``), ``pool`` (``AscendStoreConnector`` with a ``vllm-ascend kv-pool``
master: turn 1 runs on instance A, turns 2+ on a second instance B, which can only get the prefixes from
the pool). Every engine is its own process (kept for the whole run; one vLLM engine per process) driven over
a pipe; after one uncounted warm-up round (2 conversations: first requests, the pool's first connections), per
round all sides replay the same trace (new conversations each round), in alternating order. TTFT
is vLLM's own per-request ``first_token_latency``; prompt tokens by source come from ``llm.get_metrics()``
(``vllm:prompt_tokens_by_source``, ``vllm:external_prefix_cache_queries`` / ``_hits``), read around each turn.
Greedy output tokens of every request are compared across sides.

    uv run --no-sync python benchmarks/kv_offload.py copy [--rounds 5] [--write benchmarks/RESULTS-kv-offload.md]
    uv run --no-sync python benchmarks/kv_offload.py replay [--sides none offload pool] [--rounds 3] [--write F]

``--write`` puts the part's table between that part's markers in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _report import host_line, write_part_table

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_ASCEND_DEVICE": "reference",
    "TOKENIZERS_PARALLELISM": "false",
}
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


# -- copy ----------------------------------------------------------------------------------------------
def _rate(fn: Any, nbytes: int, seconds: float) -> float:
    """GB/s (1e9 B/s) of ``fn`` called repeatedly for at least ``seconds`` (and 3 calls), after one warm call."""
    fn()
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and calls >= 3:
            return calls * nbytes / elapsed / 1e9


def copy(args: argparse.Namespace) -> str:
    import torch

    from vllm_ascend.core.sdk import get_device_adaptor

    torch.set_num_threads(args.threads)
    adaptor = get_device_adaptor()
    device = adaptor.torch_device(0)
    gen = torch.Generator().manual_seed(0)
    rows = 2 * max(args.blocks)
    cases = [
        (p << 10, n, ids) for p in args.page_kib for n in args.blocks for ids in ("random", "consecutive")
    ]
    best: dict[tuple[int, int, str, str, str], float] = {}
    tensors: dict[int, tuple[Any, Any, Any, Any]] = {}
    plans: dict[tuple[int, int, str], tuple[Any, Any]] = {}
    for page in args.page_kib:
        page <<= 10
        dev = torch.zeros((rows, page), dtype=torch.int8, device=device)
        host = torch.zeros((rows, page), dtype=torch.int8)
        # the peer's contiguous pair: as many bytes as the largest case, one block-sized row per block
        peer_dev = torch.randint(-128, 128, (max(args.blocks), page), dtype=torch.int8, generator=gen).to(
            device
        )
        peer_host = torch.zeros((max(args.blocks), page), dtype=torch.int8)
        tensors[page] = (dev, host, peer_dev, peer_host)
    for page, n, ids in cases:
        if ids == "random":
            src_ids, dst_ids = (
                torch.randperm(rows, generator=gen)[:n],
                torch.randperm(rows, generator=gen)[:n],
            )
        else:
            src_ids, dst_ids = torch.arange(n // 2, n // 2 + n), torch.arange(rows - n - 3, rows - 3)
        plans[page, n, ids] = (src_ids, dst_ids)
        dev, host, peer_dev, peer_host = tensors[page]
        for direction in args.direction:
            src, dst = (dev, host) if direction == "store" else (host, dev)
            s_ids, d_ids = (src_ids, dst_ids) if direction == "store" else (dst_ids, src_ids)
            src.copy_(torch.randint(-128, 128, src.shape, dtype=torch.int8, generator=gen))
            dst.zero_()
            moved = adaptor.swap_blocks([src], [dst], s_ids, d_ids)
            adaptor.synchronize()
            untouched = torch.ones(rows, dtype=torch.bool)
            untouched[d_ids] = False
            what = f"swap_blocks {direction} {page >> 10} KiB x {n} {ids}"
            if moved != n * page or not torch.equal(dst[d_ids].cpu(), src[s_ids].cpu()):
                raise RuntimeError(f"{what}: the rows at dst_ids differ from the rows at src_ids")
            if dst.cpu()[untouched].any():
                raise RuntimeError(f"{what}: wrote rows outside dst_ids")
        p_src, p_dst = peer_dev[:n], peer_host[:n]
        p_dst.copy_(p_src)
        if not torch.equal(p_dst.cpu(), p_src.cpu()):
            raise RuntimeError("the peer's copy_ differs")
    print(f"data checked: {len(cases)} cases x {args.direction}, torch threads {torch.get_num_threads()}")
    for round_ in range(args.rounds):
        for page, n, ids in cases:
            dev, host, peer_dev, peer_host = tensors[page]
            src_ids, dst_ids = plans[page, n, ids]
            for direction in args.direction:
                if direction == "store":
                    ours = ([dev], [host], src_ids, dst_ids)
                    theirs = (peer_dev[:n], peer_host[:n])
                else:
                    ours = ([host], [dev], dst_ids, src_ids)
                    theirs = (peer_host[:n], peer_dev[:n])
                sides = [
                    ("swap_blocks", lambda o=ours: adaptor.swap_blocks(*o)),
                    ("copy_", lambda t=theirs: t[1].copy_(t[0])),
                ]
                for side, fn in sides if round_ % 2 == 0 else sides[::-1]:
                    rate = _rate(fn, n * page, args.seconds)
                    key = (page, n, ids, direction, side)
                    best[key] = max(best.get(key, 0.0), rate)
                    print(
                        f"round {round_ + 1} {page >> 10:4d} KiB x {n:4d} {ids:11s} {direction:5s} {side:11s} "
                        f"{rate:7.2f} GB/s",
                        flush=True,
                    )
    # fixed cost per call: one 16 KiB block (what a per-layer call costs beyond its bytes)
    dev, host, peer_dev, peer_host = tensors[min(tensors)]
    one = ([dev], [host], torch.tensor([1]), torch.tensor([2]))
    per_call: dict[str, float] = {}
    for round_ in range(args.rounds):
        sides = [
            ("swap_blocks", lambda: adaptor.swap_blocks(*one)),
            ("copy_", lambda: peer_host[:1].copy_(peer_dev[:1])),
        ]
        for side, fn in sides if round_ % 2 == 0 else sides[::-1]:
            seconds = min(tensors) / _rate(fn, min(tensors), args.seconds) / 1e9
            per_call[side] = min(per_call.get(side, 1e9), seconds * 1e6)
    header = "| page | blocks | ids |"
    rule = "|---:|---:|---|"
    for direction in args.direction:
        header += f" {direction} `swap_blocks` GB/s | {direction} `copy_` GB/s | ratio |"
        rule += "---:|---:|---:|"
    lines = [
        f"reference device ({device.type}), int8 `[{rows} rows, page]` device tensor and host tensor (not pinned: "
        f"`pin_memory_available()` = {adaptor.pin_memory_available()}), torch {torch.__version__} with "
        f"{args.threads} intra-op thread(s), {args.seconds:g} s per timing, best of {args.rounds}; {host_line(with_load=True)}",
        "",
        header,
        rule,
    ]
    for page, n, ids in cases:
        row = f"| {page >> 10} KiB | {n} | {ids} |"
        for direction in args.direction:
            ours, theirs = (
                best[page, n, ids, direction, "swap_blocks"],
                best[page, n, ids, direction, "copy_"],
            )
            row += f" {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f} |"
        lines.append(row)
    lines += [
        "",
        f"Per call, one {min(tensors) >> 10} KiB block (store, best of {args.rounds}): `swap_blocks` "
        f"{per_call['swap_blocks']:.1f} us, `copy_` of one row {per_call['copy_']:.1f} us.",
    ]
    return "\n".join(lines)


# -- replay: the engine process ------------------------------------------------------------------------
def engine_main(args: argparse.Namespace) -> None:
    """One engine, driven by JSON lines on stdin; answers on the original stdout, its logs go to ``--log``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = dict(
        model=args.model,
        dtype="float32",
        block_size=16,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_bytes,
        seed=0,
        enable_prefix_caching=True,
        disable_log_stats=False,
    )
    if args.side == "offload":
        kwargs["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": args.host_bytes},
        }
    elif args.side == "pool":
        kwargs["kv_transfer_config"] = {
            "kv_connector": "AscendStoreConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"master": args.master},
        }
    llm = LLM(**kwargs)

    def counters() -> dict[str, float]:
        out: dict[str, float] = {}
        for metric in llm.get_metrics():
            if not hasattr(metric, "value"):
                continue
            name = metric.name
            if name == "vllm:prompt_tokens_by_source":
                name = f"{name}:{metric.labels.get('source')}"
            out[name] = out.get(name, 0.0) + metric.value
        return out

    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        params = SamplingParams(max_tokens=request["reply"], temperature=0.0, ignore_eos=True)
        before = counters()
        ttfts, outputs = [], []
        for prompt in request["prompts"]:
            out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
            ttfts.append(out.metrics.first_token_latency)
            outputs.append(list(out.outputs[0].token_ids))
        after = counters()
        delta = {k: after[k] - before.get(k, 0.0) for k in after}
        proto.write(json.dumps({"ttft": ttfts, "outputs": outputs, "counters": delta}) + "\n")
    llm.llm_engine.engine_core.shutdown()


class Engine:
    """A child process running :func:`engine_main` for one side (or one instance of the pool side)."""

    def __init__(
        self, name: str, side: str, model: Path, args: argparse.Namespace, master: str | None
    ) -> None:
        self.name = name
        self.log = Path(args.workdir) / f"{name}.log"
        self.log.write_text("")
        cmd = [
            sys.executable, __file__, "_engine", "--side", side, "--model", str(model), "--log", str(self.log),
            "--kv-bytes", str(args.device_kv_tokens * args.kv_bytes_per_token),
            "--host-bytes", str(args.host_mib << 20), "--max-model-len", str(args.max_model_len),
        ]  # fmt: skip
        if master:
            cmd += ["--master", master]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _answer(self, timeout: float) -> dict[str, Any]:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not found or not found[0]:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"engine {self.name} gave no answer in {timeout:g}s; its log ends:\n{tail}")
        return json.loads(found[0])

    def ready(self, timeout: float = 300) -> None:
        self._answer(timeout)

    def turn(self, prompts: list[list[int]], reply: int) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps({"op": "turn", "prompts": prompts, "reply": reply}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._answer(300)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)


# -- replay: the pool master ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_master(workdir: Path) -> tuple[subprocess.Popen, str]:
    """``vllm-ascend kv-pool`` on free 127.0.0.1 ports, as users start it; returns once it printed its address."""
    port, metrics = _free_port(), _free_port()
    log = workdir / "kv-pool.log"
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_ascend.core.cli", "kv-pool", "--host", "127.0.0.1", "--port", str(port),
             "--metrics-port", str(metrics)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while f"kv-pool master at 127.0.0.1:{port}" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"kv-pool did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port}"


# -- replay: the trace ---------------------------------------------------------------------------------
def _turn1(conversations: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 500) for _ in range(rng.randrange(300, 421))] for _ in range(conversations)]


def _user_tokens(seed: int, conversation: int, turn: int) -> list[int]:
    rng = random.Random(f"{seed}/{conversation}/{turn}")
    return [rng.randrange(5, 500) for _ in range(rng.randrange(40, 81))]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _replay_round(engines: list[Engine], seed: int, conversations: int, args: argparse.Namespace) -> dict:
    """Every turn of ``conversations`` conversations of ``seed``: turn 1 on the first engine, later turns on the
    last (the same engine unless the side has two). Per-turn TTFTs, turns 2+ counter deltas, all outputs."""
    first, later = engines[0], engines[-1]
    prompts = _turn1(conversations, seed)
    record: dict[str, Any] = {"ttft1": [], "ttft": [], "counters": {}, "outputs": []}
    for turn in range(args.turns):
        answer = (first if turn == 0 else later).turn(prompts, args.reply)
        record["outputs"].append(answer["outputs"])
        if turn == 0:
            record["ttft1"] += answer["ttft"]
        else:
            record["ttft"] += answer["ttft"]
            for key, value in answer["counters"].items():
                record["counters"][key] = record["counters"].get(key, 0.0) + value
        prompts = [
            p + reply + _user_tokens(seed, i, turn + 1)
            for i, (p, reply) in enumerate(zip(prompts, answer["outputs"], strict=True))
        ]
    return record


def replay(args: argparse.Namespace) -> str:
    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec = qwen3_spec(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers,
        num_heads=args.hidden // 32, num_kv_heads=max(1, args.hidden // 64),
    )  # fmt: skip
    model = build_tiny_model(spec, work / "models")
    # K and V, fp32, head_dim 32
    args.kv_bytes_per_token = spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 4
    master_proc, master = None, None
    engines: dict[str, list[Engine]] = {}
    # per side and round: turn-1 TTFTs, later TTFTs, summed counters of turns 2+, all outputs
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    started = time.monotonic()
    try:
        if "pool" in args.sides:
            master_proc, master = _start_master(work)
        for side in args.sides:
            names = ["pool-A", "pool-B"] if side == "pool" else [side]
            engines[side] = [Engine(n, side, model, args, master) for n in names]
            for engine in engines[side]:  # one engine starting at a time: 2 cores
                engine.ready()
        print(
            f"{sum(map(len, engines.values()))} engines ready in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        for side in args.sides:  # warm-up, not counted: first requests, the pool's first connections
            warm = _replay_round(engines[side], 999, min(2, args.conversations), args)
            print(
                f"warm-up {side:8s} TTFT turn 1 max {max(warm['ttft1']) * 1e3:7.1f} ms, turns 2+ max "
                f"{max(warm['ttft']) * 1e3:7.1f} ms",
                flush=True,
            )
        for round_ in range(args.rounds):
            order = list(args.sides) if round_ % 2 == 0 else list(args.sides)[::-1]
            for side in order:
                record = _replay_round(engines[side], 1000 + round_, args.conversations, args)
                results[side].append(record)
                c = record["counters"]
                print(
                    f"round {round_ + 1} {side:8s} TTFT turn 1 p50 {statistics.median(record['ttft1']) * 1e3:6.1f} "
                    f"ms, turns 2+ p50 {statistics.median(record['ttft']) * 1e3:6.1f} ms p90 "
                    f"{_p(record['ttft'], 0.9) * 1e3:6.1f} ms max {max(record['ttft']) * 1e3:6.1f} ms; turns 2+ "
                    f"prompt tokens {c.get('vllm:prompt_tokens', 0):.0f}: computed "
                    f"{c.get(f'vllm:prompt_tokens_by_source:{SOURCES[0]}', 0):.0f}, device hits "
                    f"{c.get('vllm:prefix_cache_hits', 0):.0f}, external hits "
                    f"{c.get('vllm:external_prefix_cache_hits', 0):.0f} of "
                    f"{c.get('vllm:external_prefix_cache_queries', 0):.0f} queried",
                    flush=True,
                )
    finally:
        for side_engines in engines.values():
            for engine in side_engines:
                engine.close()
        if master_proc is not None:
            master_proc.terminate()  # kv-pool forwards SIGTERM to mooncake_master (SIGKILL would orphan it)
            try:
                master_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                master_proc.kill()
                master_proc.wait(timeout=30)
    reference = args.sides[0]
    same = {
        side: all(
            r["outputs"] == ref["outputs"] for r, ref in zip(results[side], results[reference], strict=True)
        )
        for side in args.sides
    }
    requests = args.conversations * args.turns * args.rounds
    replies = [tuple(o) for r in results[reference] for turn in r["outputs"] for o in turn]
    lines = [
        f"{args.conversations} conversations x {args.turns} turns (turn 1: 300-420 tokens; each later turn adds "
        f"the {args.reply}-token greedy reply + 40-80 user tokens), one request at a time, an uncounted warm-up round, then {args.rounds} rounds "
        f"(new conversations each, sides alternating); tiny Qwen3 (hidden {spec.hidden_size}, "
        f"{spec.num_layers} layers, {spec.num_kv_heads} KV heads, fp32, {args.kv_bytes_per_token >> 10} KiB KV "
        f"per token) on the reference device, device KV cache {args.device_kv_tokens} tokens, host offload "
        f"{args.host_mib} MiB; TTFT = vLLM's `first_token_latency`, each TTFT cell the best of the rounds; token counts "
        f"summed over all rounds' turns 2+; {len(set(replies))} distinct replies among the {len(replies)} "
        f"requests; {host_line(with_load=True)}",
        "",
        "| side | TTFT turn 1 p50 ms | TTFT turns 2+ p50 ms | TTFT turns 2+ p90 ms | prompt tokens (turns 2+) "
        "| computed | device prefix hits | external hits / queried | greedy tokens = `" + reference + "` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    label = {
        "none": "no connector (device prefix cache only)",
        "offload": "`OffloadingConnector` (host memory)",
        "pool": "`AscendStoreConnector` (turn 1 on A, turns 2+ on B)",
    }
    for side in args.sides:
        runs = results[side]
        t1 = min(statistics.median(r["ttft1"]) for r in runs) * 1e3
        t50 = min(statistics.median(r["ttft"]) for r in runs) * 1e3
        t90 = min(_p(r["ttft"], 0.9) for r in runs) * 1e3
        total: dict[str, float] = {}
        for record in results[side]:
            for key, value in record["counters"].items():
                total[key] = total.get(key, 0.0) + value
        lines.append(
            f"| {label[side]} | {t1:.1f} | {t50:.1f} | {t90:.1f} | "
            f"{total.get('vllm:prompt_tokens', 0):.0f} | {total.get(f'vllm:prompt_tokens_by_source:{SOURCES[0]}', 0):.0f} | "
            f"{total.get('vllm:prefix_cache_hits', 0):.0f} | {total.get('vllm:external_prefix_cache_hits', 0):.0f} / "
            f"{total.get('vllm:external_prefix_cache_queries', 0):.0f} | "
            f"{'yes' if same[side] else 'NO'} ({requests} requests) |"
        )
    if not all(same.values()):
        print("WARNING: greedy outputs differ across sides", flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    c = sub.add_parser("copy", help="swap_blocks bytes/s vs a plain copy_ of the same bytes")
    c.add_argument("--page-kib", type=int, nargs="+", default=[16, 64, 256])
    c.add_argument("--blocks", type=int, nargs="+", default=[32, 256])
    c.add_argument("--direction", nargs="+", choices=("store", "load"), default=["store", "load"])
    c.add_argument("--seconds", type=float, default=0.2)
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    r = sub.add_parser("replay", help="multi-turn TTFT and prefill tokens: no connector vs offload vs pool")
    r.add_argument(
        "--sides", nargs="+", choices=("none", "offload", "pool"), default=["none", "offload", "pool"]
    )
    r.add_argument("--conversations", type=int, default=8)
    r.add_argument("--turns", type=int, default=3)
    r.add_argument("--reply", type=int, default=8, help="greedy tokens generated per turn")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--hidden", type=int, default=512, help="tiny Qwen3 hidden size (heads of 32)")
    r.add_argument("--layers", type=int, default=4)
    r.add_argument("--device-kv-tokens", type=int, default=1024)
    r.add_argument("--host-mib", type=int, default=128)
    r.add_argument("--max-model-len", type=int, default=768)
    r.add_argument("--workdir", default="/tmp/kv-offload-bench")
    for p in (c, r):
        p.add_argument("--write", type=Path, help="put the table into this RESULTS file")
    e = sub.add_parser("_engine", help=argparse.SUPPRESS)
    e.add_argument("--side", required=True)
    e.add_argument("--model", required=True)
    e.add_argument("--log", required=True)
    e.add_argument("--kv-bytes", type=int, required=True)
    e.add_argument("--host-bytes", type=int, required=True)
    e.add_argument("--max-model-len", type=int, required=True)
    e.add_argument("--master")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
    if args.part == "_engine":
        engine_main(args)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks that stop the children
    table = (copy if args.part == "copy" else replay)(args)
    print(f"\n{table}")
    if args.write:
        write_part_table(args.write, args.part, table)


if __name__ == "__main__":
    main()
