"""Plugin logging: prefix, inferred module names, colour only on a tty, size-rotated file."""

from __future__ import annotations

import io
import logging

import pytest

from vllm_ascend.core import logger as ascend_logger
from vllm_ascend.core.logger import (
    AscendColoredFormatter,
    AscendFormatter,
    RotatingAscendFileHandler,
    _infer_module_name,
    _use_color,
    configure_ascend_file_logging,
    configure_ascend_logging,
    init_logger,
)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_root(monkeypatch):
    for name in ("VLLM_ASCEND_LOG_COLOR", "VLLM_ASCEND_LOG_FILE", "VLLM_ASCEND_LOG_LEVEL", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    yield
    configure_ascend_logging(force=True)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/w/packages/ascend-core/src/vllm_ascend/core/config/schema.py", "vllm_ascend.core.config.schema"),
        ("/w/src/vllm_ascend/eplb/__init__.py", "vllm_ascend.eplb"),
        ("/site-packages/vllm_ascend/runner/worker.py", "vllm_ascend.runner.worker"),
        ("/home/me/scripts/launch.py", "launch"),
    ],
)
def test_module_name_is_inferred_from_the_path(path, name):
    assert _infer_module_name(path) == name


def test_init_logger_without_name_uses_the_callers_file():
    log = init_logger()
    assert log.name == "vllm_ascend.test_logger"
    assert init_logger("vllm_ascend.core.platform").name == "vllm_ascend.core.platform"
    assert init_logger("eplb.policy").name == "vllm_ascend.eplb.policy"


def test_prefix_and_module_in_plain_output(restore_root):
    buf = io.StringIO()
    configure_ascend_logging(stream=buf, level="debug", force=True)
    init_logger("vllm_ascend.core.demo").warning("hello %s", "npu")
    line = buf.getvalue().strip()
    assert line.startswith("[vllm-ascend] WARNING ")
    assert "[test_logger:" in line and line.endswith("] hello npu")
    assert "\033[" not in line


def test_colour_only_on_a_tty(restore_root, monkeypatch):
    assert _use_color(io.StringIO()) is False
    assert _use_color(_Tty()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert _use_color(_Tty()) is False
    assert _use_color(io.StringIO(), mode="always") is True
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("VLLM_ASCEND_LOG_COLOR", "never")
    assert _use_color(_Tty()) is False

    monkeypatch.setenv("VLLM_ASCEND_LOG_COLOR", "auto")
    tty = _Tty()
    configure_ascend_logging(stream=tty, force=True)
    init_logger("vllm_ascend.core.demo").error("boom")
    assert "\033[31mERROR\033[0m" in tty.getvalue()
    handler = logging.getLogger("vllm_ascend").handlers[0]
    assert isinstance(handler.formatter, AscendColoredFormatter)


def test_coloured_formatter_does_not_leak_colour_into_other_handlers():
    record = logging.LogRecord("vllm_ascend.x", logging.INFO, "/a/vllm_ascend/x.py", 3, "m", None, None)
    coloured = AscendColoredFormatter().format(record)
    plain = AscendFormatter().format(record)
    assert "\033[32mINFO" in coloured
    assert plain.startswith("[vllm-ascend] INFO ") and plain.endswith("[vllm_ascend.x:3] m")


def test_level_from_environment(restore_root, monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_LOG_LEVEL", "error")
    buf = io.StringIO()
    configure_ascend_logging(stream=buf, force=True)
    log = init_logger("vllm_ascend.core.demo")
    log.warning("hidden")
    log.error("shown")
    assert "hidden" not in buf.getvalue() and "shown" in buf.getvalue()


def test_rotating_file_handler(tmp_path, restore_root):
    path = tmp_path / "logs" / "ascend.log"
    configure_ascend_logging(stream=io.StringIO(), force=True)
    handler = configure_ascend_file_logging(path, max_bytes=1024, backup_count=2)
    assert configure_ascend_file_logging(path) is handler  # once per path
    log = init_logger("vllm_ascend.core.demo")
    for i in range(100):
        log.info("line %03d %s", i, "x" * 40)
    handler.flush()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["ascend.log", "ascend.log.1", "ascend.log.2"]
    assert all(p.stat().st_size <= 1024 for p in path.parent.iterdir())
    assert "line 099" in path.read_text()
    assert path.read_text().startswith("[vllm-ascend] INFO ")


def test_file_logging_from_environment(tmp_path, restore_root, monkeypatch):
    path = tmp_path / "env.log"
    monkeypatch.setenv("VLLM_ASCEND_LOG_FILE", str(path))
    monkeypatch.setenv("VLLM_ASCEND_LOG_FILE_MAX_BYTES", "4096")
    monkeypatch.setenv("VLLM_ASCEND_LOG_FILE_BACKUP_COUNT", "3")
    root = configure_ascend_logging(stream=io.StringIO(), force=True)
    handlers = [h for h in root.handlers if isinstance(h, RotatingAscendFileHandler)]
    assert len(handlers) == 1
    assert (handlers[0].maxBytes, handlers[0].backupCount) == (4096, 3)
    init_logger("vllm_ascend.core.demo").info("to file")
    handlers[0].flush()
    assert "to file" in path.read_text()


def test_root_does_not_propagate_to_the_python_root(restore_root):
    root = configure_ascend_logging(stream=io.StringIO(), force=True)
    assert root.propagate is False
    assert ascend_logger.ROOT == root.name == "vllm_ascend"
