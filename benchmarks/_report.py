"""What the benchmarks that keep a ``RESULTS-*.md`` share: the machine a table was measured on, and
``--write``, which puts the table between the file's measured-table markers."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

BEGIN, END = "<!-- measured table: begin -->", "<!-- measured table: end -->"


def machine() -> str:
    """CPUs, processor and torch version of this machine."""
    return f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, torch {torch.__version__}"


def write_measured_table(path: Path, table: str) -> None:
    """Put ``table`` between the measured-table markers of ``path`` (the rest of the file is kept)."""
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def cpu_model() -> str:
    """The processor's name as ``/proc/cpuinfo`` gives it (else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_part_table(path: Path, part: str, table: str) -> None:
    """Put ``table`` between ``<!-- <part> table: begin/end -->`` in ``path`` (a file with one table per part)."""
    begin, end = f"<!-- {part} table: begin -->", f"<!-- {part} table: end -->"
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")
