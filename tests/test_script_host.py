"""``ScriptHost`` (dev/testing): scripts forked from one warm interpreter keep ``run_vllm_script``'s contract."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from vllm_ascend.testing.script_host import ScriptHost, ScriptHosts

SCRIPT = r"""
import atexit, json, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print("to stderr", file=sys.stderr)
print("RESULT " + json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "ppid": os.getppid(),
                              "method": os.environ.get("VLLM_ASCEND_MOE_COMM_METHOD"),
                              "name": __name__, "imported": "email.mime.text" in sys.modules}))
"""


@pytest.fixture
def host():
    env = {**os.environ}
    env.pop("VLLM_ASCEND_MOE_COMM_METHOD", None)
    env.pop("VLLM_ASCEND_REFERENCE_FAMILY", None)
    started = ScriptHost(["email.mime.text"], env=env)
    yield started
    started.close()


def test_a_script_forked_from_the_host_sees_its_env_argv_and_the_hosts_imports(host):
    env = {**host.env, "VLLM_ASCEND_MOE_COMM_METHOD": "mc2"}
    first, output = host.run(SCRIPT, "a", "b", env=env)
    assert first["argv"] == ["a", "b"] and first["method"] == "mc2" and first["name"] == "__main__"
    assert first["imported"]  # the host's import, not the script's
    assert (
        output.index("RESULT") < output.index("atexit ran") < output.index("to stderr")
    )  # stdout, then stderr
    second, _ = host.run(SCRIPT, env=host.env)
    assert second["method"] is None  # the variable set for the first script is gone
    assert second["ppid"] == first["ppid"] != os.getpid()  # both children of the one host
    assert second["pid"] != first["pid"]


def test_an_env_change_read_at_import_gets_a_fresh_interpreter(host):
    env = {**host.env, "VLLM_ASCEND_REFERENCE_FAMILY": "310p"}
    assert not host.serves(env)
    result, _ = host.run(SCRIPT, env=env)
    assert result["ppid"] == os.getpid() and not result["imported"]


def test_a_failing_script_fails_with_its_output_and_the_host_serves_on(host):
    with pytest.raises(AssertionError, match=r"(?s)exit code 3:.*before exit"):
        host.run("import sys\nprint('before exit')\nsys.exit(3)", env=host.env)
    with pytest.raises(AssertionError, match=r"(?s)exit code 1:.*ZeroDivisionError"):
        host.run("1 / 0", env=host.env)
    result, _ = host.run(SCRIPT, env=host.env)
    assert result["name"] == "__main__"


def test_a_script_past_its_timeout_is_killed_with_its_processes(host, tmp_path):
    marker = tmp_path / "sleeper"
    script = (
        "import subprocess, sys, time\n"
        "open(sys.argv[1], 'w').write(str(subprocess.Popen(['sleep', '300']).pid))\n"
        "time.sleep(300)"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        host.run(script, str(marker), env=host.env, timeout=5)
    sleeper = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(sleeper)  # the script's process group was killed, its children too
    result, _ = host.run(SCRIPT, env=host.env)
    assert result["argv"] == []


def _alive(pid: int) -> bool:
    try:
        status = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return status != "Z"


PROBE_SCRIPT = r"""
import json, os, probe
print("RESULT " + json.dumps({"seen": probe.SEEN, "ppid": os.getppid(), "now": os.environ.get("PROBE")}))
"""


def test_hosts_keep_one_interpreter_per_import_time_environment(tmp_path):
    """``ScriptHosts``: an environment differing outside ``FORK_SAFE_ENV`` gets its own host, importing under that
    environment as a fresh interpreter would; a fork-safe difference reuses the host; past the limit the least
    recently used host is closed."""
    (tmp_path / "probe.py").write_text("import os\nSEEN = os.environ.get('PROBE')\n")
    base = {**os.environ, "PYTHONPATH": str(tmp_path)}
    hosts = ScriptHosts(["probe"], limit=2)
    try:
        one, _ = hosts.run(PROBE_SCRIPT, env={**base, "PROBE": "1"})
        two, _ = hosts.run(PROBE_SCRIPT, env={**base, "PROBE": "2"})
        assert (one["seen"], two["seen"]) == ("1", "2") and one["ppid"] != two["ppid"] != os.getpid()
        again, _ = hosts.run(PROBE_SCRIPT, env={**base, "PROBE": "1", "VLLM_ASCEND_MOE_COMM_METHOD": "mc2"})
        assert again["ppid"] == one["ppid"]  # a fork-safe change: the same host
        three, _ = hosts.run(PROBE_SCRIPT, env={**base, "PROBE": "3"})  # over the limit: host "2" is closed
        assert three["seen"] == "3"
        back, _ = hosts.run(PROBE_SCRIPT, env={**base, "PROBE": "2"})
        assert back["seen"] == "2" and back["ppid"] != two["ppid"]  # a new host for "2"
    finally:
        hosts.close()


def test_a_host_that_cannot_start_leaves_its_scripts_to_fresh_interpreters():
    hosts = ScriptHosts(["vllm_ascend_no_such_module"])
    try:
        for _ in range(2):
            result, _ = hosts.run(SCRIPT, "x")
            assert result["argv"] == ["x"] and result["ppid"] == os.getpid()
    finally:
        hosts.close()
