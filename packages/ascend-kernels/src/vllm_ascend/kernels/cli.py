"""``vllm-ascend warmup``: compile every kernel variant a server will launch into a Triton cache
directory ahead of time (e.g. while building an image), so that a server started with
``TRITON_CACHE_DIR`` pointing there loads instead of compiling."""

from __future__ import annotations

import argparse
import json
import os
import time

from vllm_ascend.core.sdk import CliCommand

DTYPES = ("float32", "bfloat16", "float16")


def _dtypes(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    bad = [name for name in names if name not in DTYPES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--dtypes {text!r}: allowed values are {', '.join(DTYPES)}")
    return names


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        ) from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    value = _ints(text)
    if len(value) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return value[0]


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir", required=True, help="Triton cache directory to fill (TRITON_CACHE_DIR)"
    )
    parser.add_argument("--vocab-size", type=_positive, required=True, help="the model's vocabulary size")
    parser.add_argument("--device", default="cuda", help="device to warm up on: cuda[:N], npu[:N] or cpu")
    parser.add_argument(
        "--dtypes",
        type=_dtypes,
        default=("float32",),
        help=f"logits dtypes, comma-separated ({', '.join(DTYPES)})",
    )
    parser.add_argument("--head-dims", type=_ints, default=(), help="head sizes for triton_q_rms (e.g. 128)")
    parser.add_argument(
        "--workers", type=_positive, default=None, help="compile processes (default: usable CPUs)"
    )
    parser.add_argument(
        "--include", type=_names, default=None, help="only these warm-up items (comma-separated)"
    )
    parser.add_argument(
        "--exclude", type=_names, default=(), help="skip these warm-up items (comma-separated)"
    )


def run(args: argparse.Namespace) -> int:
    """Set ``TRITON_CACHE_DIR`` before Triton is imported, warm up, print one JSON line of results."""
    cache_dir = os.path.abspath(args.cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    import torch

    from vllm_ascend.kernels.warmup import kernel_warmup

    stats: dict[str, object] = {}
    start = time.perf_counter()
    results = kernel_warmup(
        torch.device(args.device),
        args.vocab_size,
        tuple(getattr(torch, name) for name in args.dtypes),
        include=args.include,
        head_dims=args.head_dims,
        exclude=args.exclude,
        workers=args.workers,
        stats=stats,
    )
    files = sum(len(names) for _, _, names in os.walk(cache_dir))
    report = {
        "cache_dir": cache_dir,
        "items": results,
        "seconds": round(time.perf_counter() - start, 3),
        "cache_files": files,
        **stats,
    }
    print(json.dumps(report))
    print(f"export TRITON_CACHE_DIR={cache_dir}  # in the server's environment")
    return 0 if all(results.values()) else 1


WARMUP_COMMAND = CliCommand(
    name="warmup",
    help="compile the kernels' Triton variants into a cache directory ahead of serving",
    configure=configure,
    run=run,
)
