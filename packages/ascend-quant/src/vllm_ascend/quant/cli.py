"""``vllm-ascend quantize``: export a Hugging Face checkpoint as a ModelSlim quantized checkpoint."""

from __future__ import annotations

import argparse

from vllm_ascend.core.sdk import CliCommand, CliError

_SCHEMES = "W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, W8A8S, W8A8SC"  # export.SCHEMES + SPARSE_SCHEMES, no torch


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheme", required=True, help=f"quantization scheme: one of {_SCHEMES}")
    parser.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="per-group size for W8A16/W4A16 (0 = per channel; default: 32 for W4A16, else per channel)",
    )
    parser.add_argument(
        "--calib-prompt",
        action="append",
        default=None,
        metavar="TEXT",
        help="a calibration prompt for static W8A8/W8A8S/W8A8SC (repeatable; default: a few built-in prompts)",
    )
    parser.add_argument(
        "--sparsity",
        type=float,
        default=None,
        help="W8A8S/W8A8SC (Atlas 310P): pruned fraction of each weight row, in [0, 1) (default 0.5)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("src", help="Hugging Face model directory (config.json, *.safetensors, tokenizer)")
    parser.add_argument("dst", help="output directory (created; must be empty unless --overwrite)")


def _run(args: argparse.Namespace) -> int:
    from vllm_ascend.quant.export import ExportError, export_modelslim

    try:
        report = export_modelslim(
            args.src,
            args.dst,
            args.scheme,
            group_size=args.group_size,
            calibration_prompts=args.calib_prompt,
            progress=not args.no_progress,
            overwrite=args.overwrite,
            sparsity=args.sparsity,
        )
    except ExportError as exc:
        raise CliError(str(exc)) from None
    print(report.summary(), flush=True)
    return 0


QUANTIZE_COMMAND = CliCommand(
    name="quantize",
    help="export a Hugging Face checkpoint as a ModelSlim quantized checkpoint (--quantization ascend)",
    configure=_configure,
    run=_run,
)
