"""VLLM_ASCEND_* variables: declared once, read lazily at access, bad values are clear errors."""

from __future__ import annotations

import pytest

from vllm_ascend.core import envs
from vllm_ascend.core.envs import EnvError, EnvVar

EXPECTED = {
    "VLLM_ASCEND_DEVICE": "auto",
    "VLLM_ASCEND_REFERENCE_FAMILY": "a2",
    "VLLM_ASCEND_DISABLED_EXTENSIONS": (),
    "VLLM_ASCEND_LOG_LEVEL": "info",
    "VLLM_ASCEND_LOG_COLOR": "auto",
    "VLLM_ASCEND_LOG_FILE": None,
    "VLLM_ASCEND_LOG_FILE_MAX_BYTES": 64 << 20,
    "VLLM_ASCEND_LOG_FILE_BACKUP_COUNT": 5,
    "VLLM_ASCEND_MOE_COMM_METHOD": None,
    "VLLM_ASCEND_BATCH_INVARIANT": False,
    "VLLM_ASCEND_KERNEL_BACKEND": "auto",
    "VLLM_ASCEND_CACHE_DIR": None,
    "VLLM_ASCEND_NPU_SMI": "npu-smi",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (*envs.variables(), *envs.UNSUPPORTED):
        monkeypatch.delenv(name, raising=False)


def test_defaults():
    assert {name: getattr(envs, name) for name in EXPECTED} == EXPECTED


def test_every_variable_is_listed_by_dir_and_has_help():
    names = set(envs.variables())
    assert set(EXPECTED) == names
    assert names.isdisjoint(envs.UNSUPPORTED)
    assert names <= set(dir(envs))
    assert all(v.help and v.name.startswith("VLLM_ASCEND_") for v in envs.variables().values())


def test_read_at_access_time(monkeypatch):
    assert envs.VLLM_ASCEND_LOG_LEVEL == "info"
    monkeypatch.setenv("VLLM_ASCEND_LOG_LEVEL", "DEBUG")
    assert envs.VLLM_ASCEND_LOG_LEVEL == "debug"
    monkeypatch.setenv("VLLM_ASCEND_LOG_LEVEL", "")
    assert envs.VLLM_ASCEND_LOG_LEVEL == "info"


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("VLLM_ASCEND_BATCH_INVARIANT", "1", True),
        ("VLLM_ASCEND_BATCH_INVARIANT", "On", True),
        ("VLLM_ASCEND_BATCH_INVARIANT", "false", False),
        ("VLLM_ASCEND_LOG_FILE_MAX_BYTES", "2048", 2048),
        ("VLLM_ASCEND_LOG_FILE_BACKUP_COUNT", "0", 0),
        ("VLLM_ASCEND_KERNEL_BACKEND", "Triton", "triton"),
        ("VLLM_ASCEND_CACHE_DIR", " /tmp/c ", "/tmp/c"),
        ("VLLM_ASCEND_LOG_FILE", " /var/log/a.log ", "/var/log/a.log"),
        ("VLLM_ASCEND_DISABLED_EXTENSIONS", "eplb, netloader,", ("eplb", "netloader")),
    ],
)
def test_valid_values_are_parsed(monkeypatch, name, raw, value):
    monkeypatch.setenv(name, raw)
    assert getattr(envs, name) == value


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (
            "VLLM_ASCEND_DEVICE",
            "gpu",
            "VLLM_ASCEND_DEVICE='gpu' is invalid; allowed values: auto, npu, reference, off",
        ),
        (
            "VLLM_ASCEND_LOG_LEVEL",
            "loud",
            "VLLM_ASCEND_LOG_LEVEL='loud' is invalid; allowed values: debug, info, warning, error, critical",
        ),
        (
            "VLLM_ASCEND_LOG_COLOR",
            "rainbow",
            "VLLM_ASCEND_LOG_COLOR='rainbow' is invalid; allowed values: auto, always, never",
        ),
        (
            "VLLM_ASCEND_BATCH_INVARIANT",
            "maybe",
            "VLLM_ASCEND_BATCH_INVARIANT='maybe' is invalid; allowed values: 1, true, yes, on, 0, false, no, off",
        ),
        (
            "VLLM_ASCEND_LOG_FILE_MAX_BYTES",
            "big",
            "VLLM_ASCEND_LOG_FILE_MAX_BYTES='big' is invalid; allowed: an integer >= 1024",
        ),
        (
            "VLLM_ASCEND_LOG_FILE_MAX_BYTES",
            "10",
            "VLLM_ASCEND_LOG_FILE_MAX_BYTES='10' is out of range; allowed: an integer >= 1024",
        ),
        (
            "VLLM_ASCEND_LOG_FILE_BACKUP_COUNT",
            "-1",
            "VLLM_ASCEND_LOG_FILE_BACKUP_COUNT='-1' is out of range; allowed: an integer >= 0 and <= 1000",
        ),
        (
            "VLLM_ASCEND_KERNEL_BACKEND",
            "cuda",
            "VLLM_ASCEND_KERNEL_BACKEND='cuda' is invalid; allowed values: auto, triton, torch",
        ),
        (
            "VLLM_ASCEND_MOE_COMM_METHOD",
            "all2all",
            "VLLM_ASCEND_MOE_COMM_METHOD='all2all' is invalid; allowed values: allgather, alltoall, mc2",
        ),
    ],
)
def test_bad_values_name_the_variable_and_allowed_values(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(EnvError) as info:
        getattr(envs, name)
    assert str(info.value) == message


def test_unknown_attribute_and_duplicate_declaration():
    with pytest.raises(AttributeError, match="has no attribute 'VLLM_ASCEND_NOPE'"):
        envs.VLLM_ASCEND_NOPE  # noqa: B018
    with pytest.raises(EnvError, match="VLLM_ASCEND_LOG_LEVEL is declared twice"):
        envs.declare(EnvVar("VLLM_ASCEND_LOG_LEVEL", "x", str, "dup"))


def test_check_environment_validates_set_values_and_reports_unknown_names():
    env = {
        "VLLM_ASCEND_LOG_LEVEL": "debug",
        "VLLM_ASCEND_LOG_LEVLE": "debug",
        "VLLM_ASCEND_ZZZ": "1",
        "VLLM_ASCEND_ENABLE_NZ": "",  # a refused variable set to "" counts as unset
        "PATH": "/bin",
    }
    assert envs.check_environment(env) == [
        "unknown environment variable VLLM_ASCEND_LOG_LEVLE is ignored; did you mean VLLM_ASCEND_LOG_LEVEL?",
        "unknown environment variable VLLM_ASCEND_ZZZ is ignored",
    ]
    with pytest.raises(EnvError, match=r"^VLLM_ASCEND_LOG_COLOR='x' is invalid; allowed values: auto"):
        envs.check_environment({"VLLM_ASCEND_LOG_COLOR": "x"})


@pytest.mark.parametrize("name", sorted(envs.UNSUPPORTED))
def test_refused_variables_are_errors_wherever_checked(monkeypatch, name):
    assert envs.UNSUPPORTED[name]
    expected = f"^`{name}` is not supported yet by vllm-ascend 0.1.0 \\(.+\\); unset it$"
    with pytest.raises(EnvError, match=expected):
        envs.check_environment({name: "1"})
    with pytest.raises(EnvError, match=expected):
        envs.refuse_unsupported({name: "0"})
    envs.refuse_unsupported({name: ""})
    with pytest.raises(AttributeError):
        getattr(envs, name)
    monkeypatch.setenv(name, "1")
    with pytest.raises(EnvError, match=expected):
        envs.refuse_unsupported()
