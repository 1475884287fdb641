"""The ``vllm-ascend`` console script. Siblings add subcommands through ``CLI_COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_ascend.core.doctor import DOCTOR
from vllm_ascend.core.extensions import load_extensions
from vllm_ascend.core.logger import init_logger
from vllm_ascend.core.registry import CLI_COMMANDS, CliCommand

__all__ = ["CliCommand", "build_parser", "main"]

logger = init_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    load_extensions()
    parser = argparse.ArgumentParser(prog="vllm-ascend", description="Huawei Ascend plugin for vLLM")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands = [DOCTOR]
    for name in CLI_COMMANDS.names():
        try:
            commands.append(CLI_COMMANDS.get(name))
        except Exception as exc:
            logger.warning(
                "Skipping subcommand %r from %s: %s: %s",
                name,
                CLI_COMMANDS.owner(name),
                type(exc).__name__,
                exc,
            )
    for command in commands:
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub_parser)
        sub_parser.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
