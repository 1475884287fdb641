"""What the benchmarks that keep a ``RESULTS-*.md`` share: the machine a table was measured on, and
``--write``, which puts the table between the file's measured-table markers."""

from __future__ import annotations

import os
import platform
import time
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


def host_line(*, with_load: bool = False) -> str:
    """CPUs, processor and date (and the load average now, for runs that share a host) for a RESULTS table."""
    line = f"{os.cpu_count()} CPUs ({cpu_model()})"
    if with_load and hasattr(os, "getloadavg"):
        line += f", load average {os.getloadavg()[0]:.1f} at the end"
    return f"{line}, {time.strftime('%Y-%m-%d %H:%M')}"
