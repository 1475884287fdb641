"""Child interpreters the CLI starts: exit statuses pass through, signal deaths are reported by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from vllm_ascend.core.child import death_report, run_module

_CRASHING_EXTENSION = textwrap.dedent(
    """
    #include <Python.h>
    #include <signal.h>
    PyMODINIT_FUNC PyInit_wide_isa(void) { raise(SIGILL); return NULL; }
    """
)


def _env(path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _module(path: Path, name: str, source: str) -> None:
    (path / f"{name}.py").write_text(textwrap.dedent(source))


def test_exit_status_and_arguments_pass_through(tmp_path, capfd):
    _module(tmp_path, "exits", "import sys\nprint(sys.argv[1:])\nsys.exit(3)\n")
    assert run_module("demo", "exits", ["--a", "b"], env=_env(tmp_path)) == 3
    out, err = capfd.readouterr()
    assert out.strip() == "['--a', 'b']" and err == ""


def test_killed_child_is_reported_with_the_signal_name(tmp_path, capfd):
    _module(tmp_path, "killed", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert run_module("serve", "killed", env=_env(tmp_path)) == 128 + signal.SIGKILL
    err = capfd.readouterr().err
    assert err.splitlines()[0] == (
        "vllm-ascend serve: its child interpreter (python -m killed) was killed by SIGKILL (Killed)"
    )
    assert "out-of-memory killer" in err


def test_sigill_while_loading_a_library_names_it_and_the_host_isa(tmp_path, capfd):
    source = tmp_path / "wide_isa.c"
    source.write_text(_CRASHING_EXTENSION)
    library = tmp_path / f"wide_isa{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(library)],
        check=True,
        timeout=120,
    )
    _module(tmp_path, "loads_wide_isa", "import json\nimport wide_isa\n")
    assert run_module("demo", "loads_wide_isa", env=_env(tmp_path)) == 128 + signal.SIGILL
    from vllm_ascend.core.device.host import host_isa

    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == (
        "vllm-ascend demo: its child interpreter (python -m loads_wide_isa) was killed by SIGILL "
        f"(Illegal instruction) while loading {library}"
    )
    assert lines[1].startswith(
        f"  hint: {library} uses an instruction this CPU lacks (host ISA {host_isa().describe()})"
    )
    assert "`vllm-ascend doctor`" in lines[1]
    assert lines[2] == "  Python stack at the crash (innermost last):"
    assert lines[-1].startswith(f'    File "{tmp_path / "loads_wide_isa.py"}", line 2')


def test_sigterm_to_the_parent_reaches_the_child(tmp_path):
    marker = tmp_path / "got"
    _module(
        tmp_path,
        "sleeper",
        f"""
        import pathlib, signal, sys, time
        def stop(signum, frame):
            pathlib.Path({str(marker)!r}).write_text(signal.Signals(signum).name)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path({str(marker)!r} + ".ready").write_text("")
        time.sleep(60)
        """,
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from vllm_ascend.core.child import run_module; "
         "sys.exit(run_module('serve', 'sleeper'))"],
        env=_env(tmp_path),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not Path(f"{marker}.ready").exists():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 0
    assert marker.read_text() == "SIGTERM"


def test_report_of_a_signal_without_records():
    report = death_report("demo", "m", signal.SIGTERM)
    assert report.splitlines() == [
        "vllm-ascend demo: its child interpreter (python -m m) was killed by SIGTERM (Terminated)",
        "  hint: stopped by a signal from outside the process",
    ]


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGABRT])
def test_crash_hint_points_at_native_code(signum):
    assert "a crash in native code" in death_report("demo", "m", signum)
