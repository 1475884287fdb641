"""Soak: rounds of concurrent seeded and unseeded completions against ``vllm-ascend serve``.

Starts the server on 127.0.0.1 with a tiny random-weight Qwen3 (built by
``vllm_ascend.testing.tiny_models``), then runs ``--rounds`` rounds of ``--concurrency``
concurrent ``/v1/completions`` requests (every other one with a ``seed``, temperature 1.0, prompts of
16-240 tokens so the default token budget chunks some prefills). After each round it prints a row:
failures, p50/p99 latency, and the RSS of the API server process and of all its descendants (vLLM's
EngineCore, and its worker where vLLM runs one), measured with psutil. The EngineCore RSS growth after
``--warmup`` rounds is printed at the end.

Sides (``--sides``, each its own server, one after the other in the same invocation):
``reference`` = ``vllm-ascend serve --device reference`` (our platform, runner, sampler); ``vllm-cpu`` =
vLLM's own OpenAI server on its CPU platform (``VLLM_ASCEND_DEVICE=off``), the baseline for whether
growth is ours. The vllm-cpu side sends every request unseeded: vLLM 0.32's CPU platform dies on a
seeded request whose prefill is chunked (``CPU Generator does not use offset``, the bug our runner fixes).

``--py-heap`` installs a probe in every server process (a ``sitecustomize`` on ``PYTHONPATH``) and, at
round 0 and after each round, asks the engine processes (SIGUSR2) for the Python heap allocated since
round 0 and still alive (tracemalloc, started at round 0) and their gc object count: RSS growth
without Python-heap growth is native (torch, the C allocator).
A benchmark, not a test: nothing is asserted.

Usage: ``python benchmarks/soak.py [--rounds 6 --concurrency 64 --sides reference,vllm-cpu]``.
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
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

SIDES = ("reference", "vllm-cpu")
SEEDED_SIDES = ("reference",)
MiB = 1 << 20
#: The ``sitecustomize`` of ``--py-heap``: the first SIGUSR2 starts tracemalloc (so imports and start-up
#: run untraced); each SIGUSR2 writes the Python heap allocated since then and still alive (total and the
#: five largest source files), and the gc object count.
HEAP_PROBE = """
import gc, json, os, signal, tracemalloc

_dir = os.environ["SOAK_HEAP_DIR"]


def _dump(signum, frame):
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    path = os.path.join(_dir, f"{os.getpid()}.json")
    top = tracemalloc.take_snapshot().statistics("filename")[:5]
    stats = {"traced": tracemalloc.get_traced_memory()[0], "objects": len(gc.get_objects()),
             "top": [[str(s.traceback[0].filename), s.size] for s in top]}
    with open(path + ".tmp", "w") as f:
        json.dump(stats, f)
    os.replace(path + ".tmp", path)


signal.signal(signal.SIGUSR2, _dump)
open(os.path.join(_dir, f"{os.getpid()}.ready"), "w").close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_argv(
    side: str, model_dir: str, port: int, kv_cache_mib: int, extra: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that serve ``model_dir`` on ``side``."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--block-size", "32",
              "--max-model-len", "512", "--kv-cache-memory-bytes", str(kv_cache_mib * MiB),
              "--served-model-name", "tiny", "--disable-log-stats", "--seed", "0", *extra]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    if side == "reference":
        return [sys.executable, "-m", "vllm_ascend.core.cli", "serve", model_dir, "--device", "reference",
                *common], env  # fmt: skip
    env["VLLM_ASCEND_DEVICE"] = "off"
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, *common], env


def _wait_healthy(proc: subprocess.Popen, base: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def _complete(
    base: str, prompt: list[int], seed: int | None, max_tokens: int, timeout_s: float
) -> float | None:
    """One completion; its latency in seconds, or None when it failed."""
    body: dict = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0}
    if seed is not None:
        body["seed"] = seed
    request = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            ok = resp.status == 200 and isinstance(json.loads(resp.read())["choices"][0]["text"], str)
    except (OSError, ValueError, KeyError, IndexError):  # HTTP errors are OSErrors
        return None
    return time.perf_counter() - start if ok else None


def _rss_mib(proc: psutil.Process) -> tuple[float, float]:
    """RSS of the server process and the sum over its descendants (EngineCore, workers), in MiB."""
    children = 0
    for child in proc.children(recursive=True):
        try:
            children += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return proc.memory_info().rss / MiB, children / MiB


def _py_heap(proc: psutil.Process, heap_dir: Path, timeout_s: float = 30.0) -> dict:
    """Traced Python heap (MiB), gc objects and the largest source files, over the probed descendants."""
    pids = [c.pid for c in proc.children(recursive=True) if (heap_dir / f"{c.pid}.ready").exists()]
    signalled = []
    for pid in pids:
        (heap_dir / f"{pid}.json").unlink(missing_ok=True)
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            continue
        signalled.append(pid)
    traced, objects, top = 0, 0, []
    deadline = time.monotonic() + timeout_s
    for pid in signalled:
        path = heap_dir / f"{pid}.json"
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if path.exists():
            stats = json.loads(path.read_text())
            traced += stats["traced"]
            objects += stats["objects"]
            top += stats["top"]
    top.sort(key=lambda item: -item[1])
    return {"py_heap_mib": traced / MiB, "gc_objects": objects, "top": top[:5]}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _soak_side(side: str, args: argparse.Namespace, model_dir: str, vocab: list[int]) -> list[dict]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    argv, env = _server_argv(side, model_dir, port, args.kv_cache_mib, args.server_arg)
    workdir = Path(tempfile.mkdtemp(prefix=f"soak-{side}-"))
    log = workdir / "server.log"
    heap_dir = workdir / "heap"
    if args.py_heap:
        heap_dir.mkdir()
        (workdir / "sitecustomize.py").write_text(HEAP_PROBE)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir), env.get("PYTHONPATH")) if p)
        env["SOAK_HEAP_DIR"] = str(heap_dir)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    rows: list[dict] = []
    try:
        _wait_healthy(proc, base, log, args.startup_timeout)
        server = psutil.Process(proc.pid)
        api, engine = _rss_mib(server)
        rows.append(
            {"round": 0, "failures": 0, "p50_ms": 0.0, "p99_ms": 0.0, "api_mib": api, "engine_mib": engine}
        )
        if args.py_heap:
            rows[-1].update(_py_heap(server, heap_dir))
        _print_row(side, rows[-1])
        rng = random.Random(0)
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            for round_no in range(1, args.rounds + 1):
                jobs = []
                for i in range(args.concurrency):
                    prompt = rng.choices(vocab, k=rng.randint(16, 240))
                    seed = rng.randrange(1 << 31) if i % 2 == 0 and side in SEEDED_SIDES else None
                    jobs.append(
                        pool.submit(_complete, base, prompt, seed, args.max_tokens, args.request_timeout)
                    )
                latencies = [job.result() for job in jobs]
                ok = [t for t in latencies if t is not None]
                api, engine = _rss_mib(server)
                rows.append({
                    "round": round_no,
                    "failures": len(latencies) - len(ok),
                    "p50_ms": statistics.median(ok) * 1e3 if ok else float("nan"),
                    "p99_ms": _percentile(ok, 0.99) * 1e3 if ok else float("nan"),
                    "api_mib": api,
                    "engine_mib": engine,
                })  # fmt: skip
                if args.py_heap:
                    rows[-1].update(_py_heap(server, heap_dir))
                _print_row(side, rows[-1])
                if proc.poll() is not None:
                    print(
                        f"{side}: server exited with {proc.returncode}:\n{log.read_text()[-3000:]}",
                        flush=True,
                    )
                    break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    return rows


def _print_row(side: str, row: dict) -> None:
    heap = f" {row['py_heap_mib']:.1f} | {row['gc_objects']} |" if "py_heap_mib" in row else ""
    print(f"| {side} | {row['round']} | {row['failures']} | {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | "
          f"{row['api_mib']:.1f} | {row['engine_mib']:.1f} |{heap}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=64, help="requests per round, all at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2, help="rounds before RSS growth is counted")
    parser.add_argument("--sides", default="reference", help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for /health")
    parser.add_argument(
        "--py-heap", action="store_true", help="EngineCore Python heap and gc objects per round"
    )
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="--kv-cache-memory-bytes in MiB")
    parser.add_argument("--server-arg", action="append", default=[], help="extra server argument (repeat)")
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; allowed: {', '.join(SIDES)}")
    if not 0 <= args.warmup < args.rounds:
        parser.error(f"--warmup={args.warmup} must be in [0, --rounds={args.rounds})")

    from transformers import AutoTokenizer

    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    model_dir = str(build_tiny_model(qwen3_spec()))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))
    print(f"tiny Qwen3 fp32 (hidden 128, 2 layers, vocab 512); {args.rounds} rounds x {args.concurrency} "
          f"concurrent completions (half seeded on {', '.join(SEEDED_SIDES)}), {args.max_tokens} tokens "
          f"each; {os.cpu_count()} CPUs\n")  # fmt: skip
    header, rule = (
        "| side | round | failures | p50 ms | p99 ms | API server RSS MiB | engine RSS MiB |",
        "|---" + "|---:" * 6 + "|",
    )
    if args.py_heap:
        header, rule = header + " engine Python heap MiB | engine gc objects |", rule + "---:|---:|"
    print(header)
    print(rule, flush=True)
    results = {side: _soak_side(side, args, model_dir, vocab) for side in sides}
    print()
    for side, rows in results.items():
        measured = [r for r in rows if r["round"] >= args.warmup]
        if len(measured) < 2:
            print(f"{side}: fewer than two rounds after warm-up; no growth figure")
            continue
        first, last = measured[0], measured[-1]
        per_round = (last["engine_mib"] - first["engine_mib"]) / (last["round"] - first["round"])
        failures = sum(r["failures"] for r in rows)
        print(f"{side}: engine RSS round {first['round']} -> {last['round']}: {first['engine_mib']:.1f} -> "
              f"{last['engine_mib']:.1f} MiB ({per_round:+.1f} MiB/round); API server "
              f"{first['api_mib']:.1f} -> {last['api_mib']:.1f} MiB; failures {failures}")  # fmt: skip
        if "top" in last:
            files = ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in last["top"])
            print(
                f"{side}: largest live Python allocations since round 0, after round {last['round']}: {files}"
            )


if __name__ == "__main__":
    main()
