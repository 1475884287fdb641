"""Worker processes that run one named job function over JSON payloads, safe to start from any caller.

Each worker is ``python -m vllm_ascend.kernels._job_pool MODULE:FUNCTION``: it reads one JSON payload
per line on its stdin and answers one JSON line per payload. multiprocessing's ``spawn`` and
``forkserver`` re-import the caller's ``__main__`` in every worker (a script without
``if __name__ == "__main__":`` runs again there and breaks the pool), and ``fork`` copies a process
that may hold a device context and threads; here the workers import only the job's module, with the
caller's ``sys.path`` and environment.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Characters of a dead worker's stderr kept in its lost payload's :class:`Outcome`.
STDERR_TAIL = 4000


class JobPoolError(ValueError):
    """A job name that does not resolve to a function."""


@dataclass(frozen=True)
class Outcome:
    """One payload's result: ``value`` (the job's return), or ``error`` (the exception, one line) and
    ``detail`` (its traceback); ``lost`` when the worker running it died (``exit`` says how, ``detail``
    holds the end of what the worker wrote to stderr: a fault handler's stack, for one)."""

    value: Any = None
    error: str | None = None
    detail: str = ""
    lost: bool = False
    exit: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.lost


def resolve(job: str) -> Callable[[Any], Any]:
    """The function ``job`` names as ``module:qualname`` (the worker imports ``module``)."""
    module, sep, qualname = job.partition(":")
    if not sep or not module or not qualname:
        raise JobPoolError(f"job={job!r} must be 'module:function'")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise JobPoolError(f"job={job!r}: {qualname!r} is not a function of module {module!r}")
    return target


def _worker_env() -> dict[str, str]:
    """The caller's environment, with its ``sys.path`` first on ``PYTHONPATH`` (what it imported
    from, e.g. a script's own ``sys.path`` additions)."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _serve(
    process: subprocess.Popen[str],
    payloads: Sequence[Any],
    take: Callable[[], int | None],
    out: dict[int, Outcome],
    lost: dict[int, subprocess.Popen[str]],
) -> None:
    """Feed ``process`` the payloads ``take`` hands out, one at a time, until none is left or it dies."""
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None
    while (index := take()) is not None:
        try:
            stdin.write(json.dumps(payloads[index]) + "\n")
            stdin.flush()
            line = stdout.readline()
        except OSError:  # a broken pipe: the worker is gone
            line = ""
        if not line:  # the worker died on this payload; the other workers take the rest
            lost[index] = process
            return
        reply = json.loads(line)
        out[index] = Outcome(reply.get("value"), reply.get("error"), reply.get("detail", ""))
    stdin.close()


def run_jobs(job: str, payloads: Sequence[Any], workers: int) -> list[Outcome]:
    """``job(payload)`` for every payload, in up to ``workers`` worker processes; outcomes in payload
    order. A worker that dies loses the payload it was running (``Outcome.lost``, with its exit status:
    negative for a signal); the others carry on. ``job`` is resolved here first, so that a wrong name
    is one :class:`JobPoolError` rather than a failure in every worker."""
    if type(workers) is not int or workers < 1:
        raise JobPoolError(f"workers={workers!r} must be a positive int")
    resolve(job)
    if not payloads:
        return []
    lock = threading.Lock()
    pending = iter(range(len(payloads)))

    def take() -> int | None:
        with lock:
            return next(pending, None)

    out: dict[int, Outcome] = {}
    lost: dict[int, subprocess.Popen[str]] = {}
    env = _worker_env()
    logs = [tempfile.TemporaryFile("w+") for _ in range(min(workers, len(payloads)))]
    processes = [
        subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", __name__, job],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
        )
        for log in logs
    ]
    threads = [threading.Thread(target=_serve, args=(p, payloads, take, out, lost)) for p in processes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tails: dict[int, str] = {}
    for process, log in zip(processes, logs, strict=True):
        assert process.stdin is not None and process.stdout is not None
        if not process.stdin.closed:
            process.stdin.close()
        process.wait()
        process.stdout.close()
        log.seek(0)
        tails[process.pid] = log.read()[-STDERR_TAIL:]
        log.close()
    # a payload neither answered nor lost was never taken: every worker had died before it
    return [
        out[i]
        if i in out
        else Outcome(lost=True, exit=lost[i].returncode, detail=tails[lost[i].pid])
        if i in lost
        else Outcome(lost=True)
        for i in range(len(payloads))
    ]


def main(argv: Sequence[str]) -> int:
    """The worker: the protocol uses the original stdout; anything the job prints goes to stderr."""
    if len(argv) != 1:
        print(f"usage: python -m {__name__} MODULE:FUNCTION", file=sys.stderr)
        return 2
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    fn = resolve(argv[0])
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = json.dumps({"value": fn(json.loads(line))})
        except Exception as exc:
            reply = json.dumps({"error": f"{type(exc).__name__}: {exc}", "detail": traceback.format_exc()})
        channel.write(reply + "\n")
        channel.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
