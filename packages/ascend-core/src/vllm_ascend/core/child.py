"""Child interpreters the CLI starts (the demo's body, the OpenAI server), and how their deaths are reported.

A child killed by a signal leaves only a negative status (the shell shows 128+N, ``subprocess.call`` turned
into an exit code shows 252 for SIGILL); :func:`run_module` reports the signal by name instead, with a hint.
The child runs through this module's ``__main__``, which writes Python's fault handler output and each
compiled extension module it is loading to files the parent reads afterwards, so a crash while loading a
native library (SIGILL from a library built for a wider ISA than the host's) names that library and the
host's ISA.
"""

from __future__ import annotations

import faulthandler
import importlib.abc
import importlib.machinery
import os
import runpy
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

#: Set in the child's environment: the folder its crash records go to (removed before the module runs).
RECORD_DIR_ENV = "VLLM_ASCEND_CHILD_RECORD_DIR"
_LOADING = "loading "
_LOADED = "loaded "
#: Signals sent to the parent alone (by a supervisor) that the child must get too. SIGINT is not forwarded:
#: a terminal's Ctrl-C already reaches the whole foreground process group, child included.
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_CRASHES = {signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}


def run_module(
    command: str,
    module: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``python -m module *args`` in a child interpreter and return its exit status.

    Signals a supervisor sends this process (SIGTERM, SIGHUP, SIGQUIT) are passed on to the child. A
    child killed by a signal is reported on stderr as ``vllm-ascend <command>: ...`` with the signal's
    name, what was loading, and a hint; the status returned is then 128 + the signal number, as a shell's.
    """
    with tempfile.TemporaryDirectory(prefix="vllm-ascend-child-") as records:
        child_env = {**(os.environ if env is None else env), RECORD_DIR_ENV: records}
        proc = subprocess.Popen([sys.executable, "-m", __name__, module, *args], env=child_env)
        previous = {sig: signal.getsignal(sig) for sig in _FORWARDED}

        def forward(signum: int, frame: FrameType | None) -> None:
            proc.send_signal(signum)

        for sig in _FORWARDED:
            signal.signal(sig, forward)
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            status = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.signal(signal.SIGINT, interrupt)
        if status >= 0:
            return status
        print(death_report(command, module, -status, Path(records)), file=sys.stderr)
        return 128 - status


def signal_death(subject: str, signum: int, loading: str | None = None) -> str:
    """``<subject> was killed by SIGNAME (description)[ while loading <library>]`` and a hint line."""
    try:
        name = signal.Signals(signum).name
        what = signal.strsignal(signum) or name
    except ValueError:
        name, what = f"signal {signum}", "unknown signal"
    where = f" while loading {loading}" if loading is not None else ""
    return f"{subject} was killed by {name} ({what}){where}\n  hint: {_hint(signum, loading)}"


def death_report(command: str, module: str, signum: int, records: Path | None = None) -> str:
    """What to tell the user about a child (``python -m module``) killed by ``signum``."""
    loading = _library_in_flight(records) if records is not None else None
    subject = f"vllm-ascend {command}: its child interpreter (python -m {module})"
    lines = [signal_death(subject, signum, loading)]
    fault = _fault_stack(records) if records is not None else []
    if fault:
        lines.append("  Python stack at the crash (innermost last):")
        lines.extend(f"    {frame}" for frame in fault)
    return "\n".join(lines)


def _hint(signum: int, loading: str | None) -> str:
    if signum == signal.SIGILL:
        from vllm_ascend.core.device.host import host_isa

        library = loading or "a native library"
        return (
            f"{library} uses an instruction this CPU lacks (host ISA {host_isa().describe()}); it was built for "
            "a newer ISA level. `vllm-ascend doctor` shows the host ISA and the vLLM kernel library the "
            "reference device loads for it"
        )
    if signum == signal.SIGKILL:
        return "killed from outside the process: most often the kernel's out-of-memory killer (see `dmesg`)"
    if signum in _CRASHES:
        where = f"in {loading}" if loading else "in native code"
        return f"a crash {where}; the Python stack below shows what was running"
    return "stopped by a signal from outside the process"


def _library_in_flight(records: Path) -> str | None:
    """The extension module file the child was loading when it died (none when every load finished)."""
    try:
        lines = (records / "imports").read_text(errors="replace").splitlines()
    except OSError:
        return None
    in_flight: list[str] = []
    for line in lines:
        if line.startswith(_LOADING):
            in_flight.append(line[len(_LOADING) :])
        elif line.startswith(_LOADED) and line[len(_LOADED) :] in in_flight:
            in_flight.remove(line[len(_LOADED) :])
    return in_flight[-1] if in_flight else None


def _fault_stack(records: Path, limit: int = 12) -> list[str]:
    """The innermost frames of the fault handler's report for the crashing thread, innermost last (the
    import system's own frames left out)."""
    try:
        text = (records / "faults").read_text(errors="replace")
    except OSError:
        return []
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ", "Stack (most recent call first)")):
            blocks.append((line, []))
        elif blocks and line.strip().startswith("File ") and not _machinery(line):
            blocks[-1][1].append(line.strip())
    current = [frames for header, frames in blocks if header.startswith("Current thread")]
    frames = current[0] if current else (blocks[0][1] if blocks else [])
    return list(reversed(frames[:limit]))


def _machinery(frame: str) -> bool:
    """Frames of the import system and of this module's recorder, which say nothing about the crash."""
    return '"<frozen ' in frame or f'{os.sep}core{os.sep}child.py"' in frame


class _ExtensionLoadRecorder(importlib.abc.MetaPathFinder):
    """Writes ``loading <file>`` before and ``loaded <file>`` after each compiled extension module loads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if isinstance(loader, importlib.machinery.ExtensionFileLoader):
                spec.loader = _RecordingExtensionLoader(loader.name, loader.path, self.fd)
            return spec  # type: ignore[no-any-return]
        return None


class _RecordingExtensionLoader(importlib.machinery.ExtensionFileLoader):
    def __init__(self, name: str, path: str, fd: int) -> None:
        super().__init__(name, path)
        self.fd = fd

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        os.write(self.fd, f"{_LOADING}{self.path}\n".encode(errors="replace"))
        try:
            return super().create_module(spec)
        finally:
            os.write(self.fd, f"{_LOADED}{self.path}\n".encode(errors="replace"))


def _child_main(argv: list[str]) -> None:
    """``python -m vllm_ascend.core.child MODULE ARGS...``: run MODULE as ``__main__``, recording crashes."""
    if not argv:
        raise SystemExit("usage: python -m vllm_ascend.core.child MODULE [ARGS...]")
    records = os.environ.pop(RECORD_DIR_ENV, None)
    if records:
        faults = open(Path(records) / "faults", "w")  # kept open for the process lifetime
        faulthandler.enable(file=faults, all_threads=True)
        imports = os.open(Path(records) / "imports", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.meta_path.insert(0, _ExtensionLoadRecorder(imports))
    module, *rest = argv
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
