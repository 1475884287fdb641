"""Scripts run in a forked child of a warm interpreter: vLLM imported once, not once per script.

A fresh ``python -c`` spends most of a short engine test importing vLLM (about 20 s of CPU). A
:class:`ScriptHost` is one interpreter that imports the given modules once and then forks a child per
script: the child takes the script's environment, argv, a new ``__main__`` and its own stdout/stderr files,
runs the script as ``python -c`` would (threads joined and ``atexit`` handlers run at its end) and exits with
the script's status. Engines, process groups and worker processes are the child's alone, as in a fresh
interpreter; only what the imports did is shared. So a script goes to a host whose environment differs from
the script's only in variables read when an engine is built, never at import (:data:`FORK_SAFE_ENV`):
:class:`ScriptHosts` keeps one host per environment otherwise (the emulated device family, say), which imports
under that environment as a fresh interpreter would. A host that cannot start leaves its scripts to fresh
interpreters (:func:`~vllm_ascend.testing.process.run_vllm_script`). Standard library only.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .process import OUTPUT_TAIL_CHARS, RESULT_PREFIX, run_vllm_script

__all__ = ["FORK_SAFE_ENV", "VLLM_IMPORTS", "ScriptHost", "ScriptHosts", "shared_script_host"]

#: What the engine scripts of the tests import: vLLM's offline and async engines, engine arguments, LoRA
#: requests (importing them resolves vLLM's platform and loads the plugins).
VLLM_IMPORTS = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.async_llm",
    "vllm.lora.request",
)

#: Variables a forked child may change: vLLM and the plugin read them when an engine is built (``vllm.envs``
#: and ``vllm_ascend.core.envs`` read lazily; vLLM caches its environment only once an engine started), and
#: pytest's note of the running test.
FORK_SAFE_ENV = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "VLLM_ASCEND_MOE_COMM_METHOD",
        "VLLM_USE_V2_MODEL_RUNNER",
        "VLLM_CACHE_ROOT",
        "VLLM_DISABLE_COMPILE_CACHE",
    }
)

#: The host: import the modules named in argv[1], say ready, then one child per request line.
_HOST = r"""
import json, os, sys

for _name in json.loads(sys.argv[1]):
    __import__(_name)
_requests, _replies = sys.stdin, sys.stdout


def _reply(**message):
    _replies.write(json.dumps(message) + "\n")
    _replies.flush()


def _child(request):
    import atexit, builtins, threading, traceback, types

    os.setsid()  # its own process group: a timeout kills the script and every process it started
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(os.devnull)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-c", *request["args"]]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(request["script"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:  # what the interpreter does at exit: join non-daemon threads, then the atexit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


_reply(ready=True)
for _line in _requests:
    _request = json.loads(_line)
    _pid = os.fork()
    if _pid == 0:
        _child(_request)
    _reply(pid=_pid)
    _reply(status=os.waitstatus_to_exitcode(os.waitpid(_pid, 0)[1]))
"""


class ScriptHost:
    """One warm interpreter (``imports`` done, environment ``env``: default this process's) forking a child per
    script; start it with :meth:`start` (or on the first :meth:`run`), stop it with :meth:`close`."""

    def __init__(
        self, imports: Iterable[str], env: Mapping[str, str] | None = None, start_timeout: float = 300
    ):
        self.imports = list(imports)
        self.env = dict(os.environ if env is None else env)
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._failed_start: str | None = None

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._buffer = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HOST, json.dumps(self.imports)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._read(self.start_timeout)  # {"ready": true}

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # the host's request loop ends
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a script with environment ``env`` may run forked from this host (see :data:`FORK_SAFE_ENV`)."""
        changed = {name for name in env.keys() | self.env.keys() if env.get(name) != self.env.get(name)}
        return changed <= FORK_SAFE_ENV

    def run(
        self, script: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> tuple[Any, str]:
        """:func:`~vllm_ascend.testing.process.run_vllm_script`'s contract (``env``: the whole environment,
        default this process's; the same result, output and failures), in a forked child where
        :meth:`serves` says so and the host started, else in a fresh interpreter."""
        env = dict(os.environ if env is None else env)
        if not self.serves(env) or self._failed_start is not None:
            return run_vllm_script(script, *args, env=env, timeout=timeout)
        try:
            self.start()
        except (AssertionError, subprocess.TimeoutExpired) as exc:  # its imports fail or hang in this env
            self._failed_start = str(exc)
            self.close()
            return run_vllm_script(script, *args, env=env, timeout=timeout)
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="vllm-ascend-script-") as folder:
            stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
            request = {
                "script": script,
                "args": list(args),
                "env": env,
                "stdout": str(stdout),
                "stderr": str(stderr),
            }
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
            pid = self._read(30)["pid"]
            try:
                status = self._read(timeout)["status"]
            except subprocess.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
                self._read(30)
                raise subprocess.TimeoutExpired(["<forked script>", *args], timeout) from None
            out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        output = out + err
        if status != 0:
            raise AssertionError(f"exit code {status}:\n{output[-OUTPUT_TAIL_CHARS:]}")
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        return (json.loads(lines[-1][len(RESULT_PREFIX) :]) if lines else None), output

    def _read(self, timeout: float) -> dict[str, Any]:
        """The host's next reply line; a host that exits or stays silent past ``timeout`` fails."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(["<script host>"], timeout)
            ready, _, _ = select.select([proc.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                self._proc = None
                raise AssertionError(f"the script host exited with {proc.wait()} (imports: {self.imports})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


class ScriptHosts:
    """One :class:`ScriptHost` per environment, told apart by the variables outside :data:`FORK_SAFE_ENV`
    (each started on its first script, with that script's environment); at most ``limit`` alive, the least
    recently used closed first."""

    def __init__(self, imports: Iterable[str], limit: int = 2):
        self.imports = list(imports)
        self.limit = limit
        self._hosts: dict[tuple[tuple[str, str], ...], ScriptHost] = {}

    def run(
        self, script: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> tuple[Any, str]:
        """:meth:`ScriptHost.run` on the host for ``env`` (default: this process's environment)."""
        env = dict(os.environ if env is None else env)
        key = tuple(sorted((name, value) for name, value in env.items() if name not in FORK_SAFE_ENV))
        host = self._hosts.pop(key, None) or ScriptHost(self.imports, env=env)
        self._hosts[key] = host  # the most recently used last
        while len(self._hosts) > self.limit:
            self._hosts.pop(next(iter(self._hosts))).close()
        return host.run(script, *args, env=env, timeout=timeout)

    def close(self) -> None:
        while self._hosts:
            self._hosts.popitem()[1].close()


_SHARED: dict[tuple[str, ...], ScriptHosts] = {}


def shared_script_host(imports: Sequence[str] = VLLM_IMPORTS) -> ScriptHosts:
    """This process's hosts for ``imports`` (closed at exit)."""
    key = tuple(imports)
    if key not in _SHARED:
        _SHARED[key] = ScriptHosts(key)
        atexit.register(_SHARED[key].close)
    return _SHARED[key]
