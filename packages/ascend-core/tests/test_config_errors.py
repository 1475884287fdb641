"""Bad additional_config input: every error names the full key path and what is allowed."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import pytest

from vllm_ascend.core.config import AscendConfig, ConfigError, RejectionSamplerConfig
from vllm_ascend.core.config.jsonio import JsonInputError, json_depth, parse_json, read_json_file
from vllm_ascend.core.config.schema import Section, option

TOP_KEYS = "dump_config_path, enable_cpu_binding, rejection_sampler_config, rl_config"
P = "additional_config"
R = f"{P}.rejection_sampler_config"
R_KEYS = "posterior_alpha, posterior_threshold, verify_method"

CASES = [
    # unknown keys, with and without a suggestion
    (
        {"enable_cpu_bindng": True},
        f"unknown option {P}.enable_cpu_bindng; did you mean 'enable_cpu_binding'? Allowed keys: {TOP_KEYS}",
    ),
    ({"zzz": 1}, f"unknown option {P}.zzz. Allowed keys: {TOP_KEYS}"),
    (
        {"rejection_sampler_config": {"verify_methd": "strict"}},
        f"unknown option {R}.verify_methd; did you mean 'verify_method'? Allowed keys: {R_KEYS}",
    ),
    # wrong types
    (
        {"enable_cpu_binding": "yes"},
        f"{P}.enable_cpu_binding must be a boolean (true or false), got str 'yes'",
    ),
    ({"enable_cpu_binding": 1}, f"{P}.enable_cpu_binding must be a boolean (true or false), got int 1"),
    ({"enable_cpu_binding": None}, f"{P}.enable_cpu_binding must not be null"),
    ({"dump_config_path": 5}, f"{P}.dump_config_path must be a string, got int 5"),
    (
        {"rejection_sampler_config": 5},
        f"{R} must be a JSON object (allowed keys: {R_KEYS}), got int 5",
    ),
    ({"rejection_sampler_config": {"verify_method": 3}}, f"{R}.verify_method must be a string, got int 3"),
    # not an allowed value
    (
        {"rejection_sampler_config": {"verify_method": "greedy"}},
        f"{R}.verify_method = 'greedy' is invalid; allowed values: 'strict', 'block', 'entropy'",
    ),
    # out of range
    (
        {"rejection_sampler_config": {"posterior_threshold": 0}},
        f"{R}.posterior_threshold = 0.0 is out of range; allowed: > 0 and <= 1",
    ),
    (
        {"rejection_sampler_config": {"posterior_threshold": 1.5}},
        f"{R}.posterior_threshold = 1.5 is out of range; allowed: > 0 and <= 1",
    ),
    (
        {"rejection_sampler_config": {"posterior_alpha": -0.1}},
        f"{R}.posterior_alpha = -0.1 is out of range; allowed: > 0",
    ),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_additional_config_is_rejected_with_exact_message(data, message):
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict(data)
    assert str(info.value) == message


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_additional_config_must_be_an_object():
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict([1])  # type: ignore[arg-type]
    assert str(info.value) == "additional_config must be a JSON object, got list [1]"


def test_invalid_json_is_reported():
    with pytest.raises(ConfigError, match=r"^additional_config is not valid JSON: Expecting ',' delimiter"):
        AscendConfig.from_json('{"enable_cpu_binding": true "x": 1}')


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError) as info:
        RejectionSamplerConfig(verify_method="entropy", posterior_alpha=0.0)
    assert str(info.value) == f"{R}.posterior_alpha = 0.0 is out of range; allowed: > 0"
    with pytest.raises(ConfigError) as info:
        AscendConfig(rejection_sampler_config={"verify_method": "x"})  # type: ignore[arg-type]
    assert (
        str(info.value) == f"{R}.verify_method = 'x' is invalid; allowed values: 'strict', 'block', 'entropy'"
    )
    built = AscendConfig(rejection_sampler_config={"verify_method": "strict"})  # type: ignore[arg-type]
    assert built.rejection_sampler_config == RejectionSamplerConfig()


def test_replace_revalidates():
    config = AscendConfig()
    with pytest.raises(ConfigError, match=r"additional_config.enable_cpu_binding must be a boolean"):
        config.replace(enable_cpu_binding="x")
    assert config.replace(enable_cpu_binding=True).enable_cpu_binding is True


@dataclasses.dataclass(frozen=True)
class _Numbers(Section):
    """A section with one int and one float field, to exercise scalar coercion directly."""

    PATH: ClassVar[str] = "additional_config.numbers"

    count: int = option(1, doc="an int")
    ratio: float = option(0.5, doc="a float")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ratio": math.nan}, "additional_config.numbers.ratio must be a finite number, got nan"),
        ({"ratio": math.inf}, "additional_config.numbers.ratio must be a finite number, got inf"),
        ({"ratio": -math.inf}, "additional_config.numbers.ratio must be a finite number, got -inf"),
        (
            {"ratio": 10**30},
            "additional_config.numbers.ratio = 1000000000000000000000000000000 is out of range; "
            "numbers must lie in [-9223372036854775808, 9223372036854775807]",
        ),
        ({"count": 1e30}, "additional_config.numbers.count must be an integer, got float 1e+30"),
        ({"count": 2.5}, "additional_config.numbers.count must be an integer, got float 2.5"),
        ({"count": math.nan}, "additional_config.numbers.count must be an integer, got float nan"),
        (
            {"count": 2**63},
            "additional_config.numbers.count = 9223372036854775808 is out of range; "
            "integers must lie in [-9223372036854775808, 9223372036854775807]",
        ),
        (
            {"count": -(10**5000)},
            "additional_config.numbers.count = an integer of 16610 bits is out of range; "
            "integers must lie in [-9223372036854775808, 9223372036854775807]",
        ),
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "float-huge-int",
        "int-1e30",
        "int-2.5",
        "int-nan",
        "int-2**63",
        "int-10**5000",
    ],
)
def test_non_finite_floats_and_absurd_integers_are_refused(data, message):
    with pytest.raises(ConfigError) as info:
        _Numbers.from_dict(data)
    assert str(info.value) == message
    edge = _Numbers.from_dict({"count": 2**63 - 1, "ratio": -(2**63)})
    assert (edge.count, edge.ratio) == (2**63 - 1, float(-(2**63)))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"enable_cpu_binding": NaN}', "additional_config is not valid JSON: NaN is not a JSON number"),
        ('{"a": -Infinity}', "additional_config is not valid JSON: -Infinity is not a JSON number"),
        ('{"a": ' * 100 + "1" + "}" * 100, "additional_config is nested 100 levels deep; at most 64 levels"),
        ("[" * 100_000, "additional_config is nested 100000 levels deep; at most 64 levels"),
        (
            '{"a": 1' + "0" * 5000 + "}",
            "additional_config is not valid JSON: Exceeds the limit (4300 digits)",
        ),
    ],
    ids=["nan", "-inf", "deep-100", "deep-100000", "long-int"],
)
def test_hostile_additional_config_json_is_a_config_error(text, message):
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_json(text)
    assert str(info.value).startswith(message)


def test_brackets_inside_strings_do_not_count_as_nesting():
    assert json_depth('{"a": "[[[[{{{{\\"]]", "b": [[1]]}') == 3
    assert json_depth("") == 0
    assert parse_json('{"k": "' + "[" * 1000 + '"}', "x") == {"k": "[" * 1000}


def test_read_json_file_errors_name_the_path(tmp_path):
    path = tmp_path / "doc.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(JsonInputError) as info:
        read_json_file(path)
    assert (info.value.source, info.value.problem) == (
        repr(str(path)),
        "not UTF-8: byte 0xff at offset 7 (invalid start byte)",
    )
    path.write_bytes(b"[1, 2, 3]")
    with pytest.raises(JsonInputError, match=r"is too large: 9 bytes; at most 8 are allowed"):
        read_json_file(path, max_bytes=8)
    assert read_json_file(path, max_bytes=9) == [1, 2, 3]
    with pytest.raises(JsonInputError, match=r"is unreadable: No such file or directory"):
        read_json_file(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty: expected a JSON document"),
        (b" \r\n\t ", "empty: expected a JSON document"),
        (b"\xef\xbb\xbf{}", "not valid JSON: it starts with a UTF-8 byte order mark (save it without a BOM)"),
        (b'{"a": "caf\xe9"}', "not UTF-8: byte 0xe9 at offset 10 (invalid continuation byte)"),
    ],
    ids=["empty", "blank", "bom", "latin-1"],
)
def test_read_json_file_names_empty_bom_and_latin1_files(tmp_path, content, problem):
    path = tmp_path / "doc.json"
    path.write_bytes(content)
    with pytest.raises(JsonInputError) as info:
        read_json_file(path)
    assert (info.value.source, info.value.problem) == (repr(str(path)), problem)
    assert str(info.value) == f"{str(path)!r} is {problem}"
