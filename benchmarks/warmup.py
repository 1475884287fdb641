"""Cold and warm start of the kernel warm-up (``vllm-ascend warmup``) on a GPU.

Each measurement runs in a fresh process (imports, device context and Triton's in-memory caches
start empty, as in a new server): "cold" with an empty Triton cache directory, "warm" again on the
directory the cold run filled. ``--workers`` lists the compile-process counts to measure (1 =
serial, the warm-up before ahead-of-time compilation). Columns: seconds of the whole warm-up call and
of the process, its phases (passes that held launches back while queueing the variants missing from
the cache, compiling those in the worker processes with their launchers, the last pass, which launched
everything), passes, variants compiled ahead, launchers built with them, variants the first pass found
cached, launches that still compiled, and files in the cache. Run from the repository root:

    python benchmarks/warmup.py --vocab-size 151936 --dtypes float32,bfloat16 --head-dims 128 --workers 16,1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = [str(ROOT / "packages/ascend-core/src"), str(ROOT / "packages/ascend-kernels/src")]


def child(argv: list[str]) -> int:
    """Inside the measured process: the CLI's own argument parsing and run."""
    sys.path[:0] = SRC
    from vllm_ascend.kernels import cli

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return cli.run(parser.parse_args(argv))


def measure(args: argparse.Namespace, workers: int, cache_dir: str) -> dict:
    argv = [
        "--cache-dir", cache_dir, "--vocab-size", str(args.vocab_size), "--device", args.device,
        "--dtypes", args.dtypes, "--workers", str(workers),
    ]  # fmt: skip
    if args.head_dims:
        argv += ["--head-dims", args.head_dims]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*SRC, os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", *argv], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"warm-up with {workers} workers failed (exit {done.returncode})")
    report = json.loads(lines[-1])
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    if warnings:
        print(f"warnings ({workers} workers):", *warnings[:20], sep="\n  ", file=sys.stderr)
    if report.get("variants") == 0 and not report.get("cached"):
        print("nothing compiled ahead; the warm-up's log:", done.stderr[-4000:], sep="\n", file=sys.stderr)
    return {"process_s": round(wall, 2), **report}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        raise SystemExit(child(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--head-dims", default="128")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", default="16,1", help="comma list of compile-process counts")
    parser.add_argument("--json", default="", help="write the rows to this file")
    args = parser.parse_args()
    rows = []
    print(
        "| workers | start | warm-up s | process s | record s | compile s | launch s | passes | variants | "
        "launchers | cached | compiled at launch | files |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache_dir:
            for start in ("cold", "warm"):
                row = {"workers": workers, "start": start, **measure(args, workers, cache_dir)}
                rows.append(row)
                at_launch = row.get("compiled_at_launch")
                print(
                    f"| {workers} | {start} | {row['seconds']} | {row['process_s']} | {row.get('record_s', '-')} | "
                    f"{row.get('compile_s', '-')} | {row.get('launch_s', '-')} | {row.get('passes', '-')} | "
                    f"{row.get('variants', '-')} | {row.get('launchers', '-')} | {row.get('cached', '-')} | "
                    f"{'-' if at_launch is None else len(at_launch)} | {row['cache_files']} |",
                    flush=True,
                )
        by_kernel = rows[-2].get("variants_by_kernel")
        if by_kernel:
            print(
                "variants by kernel (cold):",
                json.dumps(dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))),
            )
        for row in rows[-2:]:
            if row.get("compiled_at_launch"):
                print(f"compiled at launch ({row['start']}):", ", ".join(row["compiled_at_launch"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
