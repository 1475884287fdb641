"""The ``vllm-ascend`` console script. Siblings add subcommands through ``CLI_COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_ascend.core.doctor import DOCTOR
from vllm_ascend.core.extensions import load_extensions
from vllm_ascend.core.logger import init_logger
from vllm_ascend.core.registry import CLI_COMMANDS, CliCommand, CliError

__all__ = ["CliCommand", "CliError", "build_parser", "main"]

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
    """Run a subcommand. A user's mistake (:class:`CliError`) or a file/port the system refuses
    (``OSError``) is one line on stderr naming the command, with status 2; Ctrl-C is status 130."""
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args))
    except (CliError, OSError) as exc:
        print(f"vllm-ascend {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vllm-ascend {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
