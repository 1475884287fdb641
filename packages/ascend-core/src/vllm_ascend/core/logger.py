"""Plugin logging: ``[vllm-ascend]`` prefix, module names from file paths, optional rotated log file.

vLLM configures only the ``vllm.*`` loggers, so the ``vllm_ascend`` hierarchy gets its own
handler here. Level, colour and the log file come from ``VLLM_ASCEND_LOG_*`` (see ``envs``).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path, PurePath
from typing import TextIO

from vllm_ascend.core import envs

ROOT = "vllm_ascend"
PREFIX = "[vllm-ascend]"
_FORMAT = PREFIX + " %(levelname)s %(asctime)s [%(ascend_module)s:%(lineno)d] %(message)s"
_DATEFMT = "%m-%d %H:%M:%S"
_COLORS = {
    logging.DEBUG: "\033[36m",
    logging.INFO: "\033[32m",
    logging.WARNING: "\033[33m",
    logging.ERROR: "\033[31m",
    logging.CRITICAL: "\033[1;31m",
}
_RESET = "\033[0m"


def _infer_module_name(path: str) -> str:
    """``.../src/vllm_ascend/core/config/schema.py`` → ``vllm_ascend.core.config.schema``.

    Files outside a ``vllm_ascend`` directory are named by their file stem.
    """
    parts = PurePath(path).parts
    if ROOT in parts:
        start = len(parts) - 1 - parts[::-1].index(ROOT)
        names = [*parts[start:-1], PurePath(parts[-1]).stem]
        if names[-1] == "__init__":
            names.pop()
        return ".".join(names)
    return PurePath(path).stem or ROOT


class AscendFormatter(logging.Formatter):
    """``[vllm-ascend] LEVEL time [module:line] message``, module inferred from the record's file."""

    def __init__(self) -> None:
        super().__init__(_FORMAT, datefmt=_DATEFMT)

    def format(self, record: logging.LogRecord) -> str:
        record.ascend_module = _infer_module_name(record.pathname) if record.pathname else record.name
        return super().format(record)


class AscendColoredFormatter(AscendFormatter):
    """:class:`AscendFormatter` with the level name coloured (for terminals)."""

    def format(self, record: logging.LogRecord) -> str:
        plain = record.levelname
        color = _COLORS.get(record.levelno)
        if color:
            record.levelname = f"{color}{plain}{_RESET}"
        try:
            return super().format(record)
        finally:
            record.levelname = plain


def _use_color(stream: TextIO, mode: str | None = None) -> bool:
    """Colour when forced (``always``), never when ``never``; ``auto``: a tty and no ``NO_COLOR``."""
    mode = envs.VLLM_ASCEND_LOG_COLOR if mode is None else mode
    if mode == "always":
        return True
    if mode == "never":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ


class RotatingAscendFileHandler(logging.handlers.RotatingFileHandler):
    """Size-rotated log file (``path``, ``path.1`` ... ``path.N``); creates the parent directory."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, backup_count: int) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(target, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8")
        self.setFormatter(AscendFormatter())


def configure_ascend_file_logging(
    path: str | os.PathLike[str], max_bytes: int | None = None, backup_count: int | None = None
) -> RotatingAscendFileHandler:
    """Add a rotated file handler to the ``vllm_ascend`` logger (once per path)."""
    root = logging.getLogger(ROOT)
    resolved = os.path.abspath(path)
    for handler in root.handlers:
        if isinstance(handler, RotatingAscendFileHandler) and handler.baseFilename == resolved:
            return handler
    handler = RotatingAscendFileHandler(
        resolved,
        envs.VLLM_ASCEND_LOG_FILE_MAX_BYTES if max_bytes is None else max_bytes,
        envs.VLLM_ASCEND_LOG_FILE_BACKUP_COUNT if backup_count is None else backup_count,
    )
    root.addHandler(handler)
    return handler


def configure_ascend_logging(
    stream: TextIO | None = None, level: str | None = None, force: bool = False
) -> logging.Logger:
    """Install the stream handler (and the env-configured file handler) on ``vllm_ascend``.

    Idempotent; ``force`` replaces handlers installed earlier (e.g. to log to another stream).
    """
    root = logging.getLogger(ROOT)
    if getattr(root, "_vllm_ascend_configured", False) and not force:
        return root
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    out = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(out)
    handler.setFormatter(AscendColoredFormatter() if _use_color(out) else AscendFormatter())
    root.addHandler(handler)
    root.setLevel((level or envs.VLLM_ASCEND_LOG_LEVEL).upper())
    root.propagate = False
    log_file = envs.VLLM_ASCEND_LOG_FILE
    if log_file:
        configure_ascend_file_logging(log_file)
    root._vllm_ascend_configured = True  # type: ignore[attr-defined]
    return root


def init_logger(name: str | None = None) -> logging.Logger:
    """A logger in the ``vllm_ascend`` hierarchy; without ``name``, named after the caller's file."""
    configure_ascend_logging()
    if name is None:
        name = _infer_module_name(sys._getframe(1).f_code.co_filename)
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)
