"""The ``vllm-ascend`` console script. Siblings add subcommands through ``CLI_COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_ascend.core.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class CliCommand:
    """A subcommand: ``configure`` adds its arguments, ``run`` returns the exit status."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    from vllm_ascend.core.doctor import DOCTOR
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import CLI_COMMANDS

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
